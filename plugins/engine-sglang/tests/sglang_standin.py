"""A STAND-IN for an SGLang server, for tests only: SGLang needs a GPU and cannot run here.

It speaks the part of SGLang's native HTTP API that ``slr_engine_sglang`` uses, with
SGLang's request and response shapes (checked against SGLang's source by
``test_sglang_schema.py``), and it is backed by a REAL model: any ``slr`` Engine (the hf
engine with a tiny model in the tests) samples the tokens and reports their log-probs.
What it does not model: SGLang's scheduler, its radix cache, CUDA graphs, numerics.

- ``POST /generate``: ``input_ids``, ``rid``, ``sampling_params`` (SGLang's names),
  ``return_logprob``, ``stream`` (cumulative events by default, as SGLang streams;
  ``incremental=True`` as with ``--incremental-streaming-output``),
  ``return_routed_experts`` (base64 int32, positions ``[0, prompt + completion - 1)``);
  SGLang's two context-length errors; fields SGLang does not know are refused (SGLang
  would ignore them: the stand-in is stricter so a misspelt field fails a test).
- ``POST /abort_request`` ``{"rid"}``: the request ends with ``{"type": "abort"}``.
- ``POST /load_lora_adapter`` ``{"lora_name", "lora_path"}`` (with ``enable_lora``, as
  ``--enable-lora``): REALLY reads the peft folder (``slr.engines.lora.read_adapter``) and keeps it
  by name; ``/unload_lora_adapter`` ``{"lora_name"}`` drops it; a ``/generate`` naming one
  (``lora_path``) runs with it applied to the backing hf model through the same peft layers
  the hf engine uses (``slr.engines.lora.load_weights``), a request naming none with that adapter
  zeroed (the base's output exactly). The backing model holds one adapter at a time, so
  requests naming different adapters take turns (each switch waits for the running ones);
  SGLang batches them together. ``POST /update_weight_version`` sets the reported version.
- ``POST /update_weights_from_disk`` ``{"model_path", "weight_version"}``: loads
  ``model.safetensors`` from the folder into the backing engine.
- ``POST /init_weights_update_group``: REALLY joins the torch.distributed group the body
  names (as rank ``rank_offset``, SGLang's construction: ``slr_engine_sglang.group``), with
  the backend it names (gloo here; nccl fails as on a machine without GPUs);
  ``/update_weights_from_distributed`` receives each named tensor by broadcast from rank
  0 and loads it into the backing engine; ``/destroy_weights_update_group`` leaves.
- ``POST /update_weights_from_tensor``: unpickles the shared-memory tensors (SGLang's
  ``MultiprocessingSerializer`` format) and loads them.
- ``GET /health``, ``/get_model_info``, ``/get_server_info``, ``/v1/models``;
  ``POST /flush_cache``.
- Not SGLang's: ``POST /standin/hold_after`` ``{"tokens": n}`` sets ``hold_after``, and
  ``GET /standin/requests`` lists the requests recorded, for a stand-in running as its
  own process.

A process joins a named torch.distributed group once: a stand-in that joins groups must
run in another process than the engine that opens them (``main``).

Run as a script it is also a stand-in ``python -m sglang.launch_server --model-path M
--host H --port P ...``: it serves the model folder M with the hf engine and writes its
argv and environment to ``$SGLANG_STANDIN_RECORD``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import queue
import struct
import sys
import threading
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from slr_engine_sglang import group as groups
from slr_engine_sglang import tensors

from slr.contracts import ContextOverflow, SamplingParams

# What the stand-in accepts: a subset of SGLang's GenerateReqInput and SamplingParams
# (test_sglang_schema.py checks that each is a field SGLang declares).
ACCEPTED_GENERATE_FIELDS = frozenset(
    {
        "rid",
        "input_ids",
        "sampling_params",
        "return_logprob",
        "logprob_start_len",
        "stream",
        "return_routed_experts",
        "lora_path",
    }
)
ACCEPTED_SAMPLING_FIELDS = frozenset(
    {
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop",
        "stop_token_ids",
        "sampling_seed",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
    }
)
# ... and of the weight-update requests (InitWeightsUpdateGroupReqInput and friends)
ACCEPTED_INIT_GROUP_FIELDS = frozenset(
    {"master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"}
)
ACCEPTED_DISTRIBUTED_FIELDS = frozenset(
    {"names", "dtypes", "shapes", "group_name", "flush_cache", "weight_version"}
)
ACCEPTED_TENSOR_FIELDS = frozenset(
    {"serialized_named_tensors", "load_format", "flush_cache", "weight_version"}
)
ACCEPTED_DESTROY_GROUP_FIELDS = frozenset({"group_name"})
# ... and of LoRA (LoadLoRAAdapterReqInput, UnloadLoRAAdapterReqInput) and versions
ACCEPTED_LOAD_LORA_FIELDS = frozenset({"lora_name", "lora_path"})
ACCEPTED_UNLOAD_LORA_FIELDS = frozenset({"lora_name"})
ACCEPTED_WEIGHT_VERSION_FIELDS = frozenset({"new_version", "abort_all_requests"})


class SglangStandIn:
    """An HTTP server in a thread, answering SGLang's API from ``engine`` (a real one)."""

    def __init__(
        self,
        engine: Any,
        *,
        served_model_name: str = "slr-policy",
        context_length: int | None = None,
        incremental: bool = False,
        routed_experts: bool = False,
        enable_lora: bool = False,
        max_lora_rank: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.engine = engine
        self.served_model_name = served_model_name
        self.context_length = context_length or engine.max_context
        self.incremental = incremental
        self.routed_experts = routed_experts
        self.enable_lora = enable_lora
        self.max_lora_rank = max_lora_rank
        self.adapters: dict[str, Any] = {}  # loaded LoRA adapters by name (WeightUpdates)
        self.adapter_paths: dict[str, str] = {}
        self.applied: str | None = None  # the adapter in effect on the backing model
        self.on_model: Any = None  # the adapter whose peft layers the model carries
        self.adapter_lock = asyncio.Lock()  # one adapter switch (and admission) at a time
        self.weight_version = "default"
        self.requests: list[dict[str, Any]] = []
        self.fail_with: int | None = None  # answer /generate with this HTTP status
        # hold the next request after this many tokens until it is aborted: a server busy
        # mid-generation, so a test can act at a known token boundary
        self.hold_after: int | None = None
        self.lock = threading.Lock()
        self.running: dict[str, asyncio.Task] = {}
        self.groups: dict[str, Any] = {}  # weight groups joined, by name
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._loop_thread.start()
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self._http_thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._http_thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(10)

    def call(self, coro: Any, timeout: float | None = None) -> Any:
        """Run ``coro`` on the stand-in's event loop (where the engine is driven)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    # -- /generate ---------------------------------------------------------------------

    def check(self, body: Any) -> tuple[int, dict[str, Any]] | None:
        """SGLang's refusals for a ``/generate`` body, or None when it is acceptable."""
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        unknown = set(body) - ACCEPTED_GENERATE_FIELDS
        params = body.get("sampling_params") or {}
        unknown |= {f"sampling_params.{k}" for k in set(params) - ACCEPTED_SAMPLING_FIELDS}
        if unknown:
            return _error(400, f"stand-in does not accept {sorted(unknown)}")
        ids = body.get("input_ids")
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            return _error(400, "input_ids must be a list of token ids here")
        n, ctx = len(ids), self.context_length
        if n >= ctx:
            return _error(
                400,
                f"The input ({n} tokens) is longer than the model's context length ({ctx} tokens).",
            )
        new = params.get("max_new_tokens", 128)
        if new is not None and new + n >= ctx:
            return _error(
                400,
                f"Requested token count exceeds the model's maximum context length of {ctx} "
                f"tokens. You requested a total of {new + n} tokens: {n} tokens from the "
                f"input messages and {new} tokens for the completion. Please reduce the "
                f"number of tokens in the input messages or the completion to fit within "
                f"the limit.",
            )
        lora = body.get("lora_path")
        if lora is not None and lora not in self.adapters:
            return _error(
                400,
                f"The following requested LoRA adapters are not loaded: {lora}\n"
                f"Loaded adapters: {list(self.adapters)}.",
            )
        if self.fail_with is not None:
            return _error(self.fail_with, "stand-in failure")
        return None

    async def _produce(self, rid: str, body: dict[str, Any], out: queue.Queue) -> None:
        params = body.get("sampling_params") or {}
        temperature = float(params.get("temperature", 1.0))
        sampling = SamplingParams(
            temperature=0.0 if temperature < 1e-6 else temperature,
            top_p=float(params.get("top_p", 1.0)),
            top_k=max(int(params.get("top_k", -1)), 0),
            max_tokens=max(int(params.get("max_new_tokens", 128)), 1),
            stop=tuple(params.get("stop") or ()),
            stop_token_ids=tuple(params.get("stop_token_ids") or ()),
            seed=params.get("sampling_seed"),
        )
        reason: dict[str, Any] | None = None
        hold, self.hold_after = self.hold_after, None
        count = 0
        try:
            async with aclosing(self.engine.stream(body["input_ids"], sampling)) as chunks:
                # the adapter is applied, and the request admitted, before another may switch
                async with self.adapter_lock:
                    await self._use_adapter(body.get("lora_path"))
                    first = await anext(chunks, None)
                async for chunk in _prepend(first, chunks):
                    out.put(("chunk", chunk))
                    count += len(chunk.token_ids)
                    if hold is not None and count >= hold and chunk.finish_reason is None:
                        await asyncio.Event().wait()  # until /abort_request cancels us
                    if chunk.finish_reason is not None:
                        reason = {"type": chunk.finish_reason}
                        if chunk.finish_reason == "stop" and chunk.token_ids:
                            reason["matched"] = chunk.token_ids[-1]
                        elif chunk.finish_reason == "length":
                            reason["length"] = sampling.max_tokens
            out.put(("end", reason))
        except asyncio.CancelledError:
            out.put(
                (
                    "end",
                    {
                        "type": "abort",
                        "message": "Abort in running request.",
                        "status_code": None,
                        "err_type": None,
                    },
                )
            )
        except ContextOverflow as exc:
            out.put(("error", (400, str(exc))))
        except Exception as exc:  # the backing engine failed: a server error
            out.put(("error", (500, f"{type(exc).__name__}: {exc}")))
        finally:
            with self.lock:
                self.running.pop(rid, None)

    def start_request(self, body: dict[str, Any]) -> tuple[str, queue.Queue]:
        rid = str(body.get("rid") or f"standin-{time.monotonic_ns()}")
        out: queue.Queue = queue.Queue()

        async def spawn() -> None:
            task = asyncio.ensure_future(self._produce(rid, body, out))
            with self.lock:
                self.running[rid] = task

        self.call(spawn())
        return rid, out

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Return once every request the stand-in is serving has ended."""

        async def idle() -> None:
            with self.lock:
                tasks = list(self.running.values())
            await asyncio.gather(*tasks, return_exceptions=True)

        self.call(idle(), timeout)

    def abort(self, rid: str | None, abort_all: bool = False) -> None:
        with self.lock:
            tasks = list(self.running.values()) if abort_all else [self.running.get(rid or "")]
        for task in tasks:
            if task is not None:
                self.loop.call_soon_threadsafe(task.cancel)

    def answer(self, rid: str, body: dict[str, Any], tokens: list, lps: list, state: dict) -> dict:
        """An SGLang ``/generate`` answer for the tokens so far (``state`` holds the rest)."""
        n_prompt = len(body["input_ids"])
        reason = state.get("reason")
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": reason,
            "prompt_tokens": n_prompt,
            "weight_version": state["version"],
            "num_retractions": 0,
            "completion_tokens": len(tokens),
            "cached_tokens": 0,
            "reasoning_tokens": 0,
        }
        sent = state.get("sent", 0) if self.incremental and body.get("stream") else 0
        if body.get("return_logprob"):
            pairs = list(zip(lps, tokens, strict=True))
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in pairs][sent:]
            meta["input_token_logprobs"] = []
            meta["output_token_logprobs_length"] = len(pairs)
        if state["version"] != "default":
            meta["weight_versions"] = [
                {"version": state["version"], "start": 0, "end": len(tokens)}
            ]
        if reason is not None:
            meta["e2e_latency"] = time.monotonic() - state["started"]
            rows = state.get("routing")
            if body.get("return_routed_experts") and self.routed_experts and rows is not None:
                flat = [
                    e for row in rows[: n_prompt + len(tokens) - 1] for layer in row for e in layer
                ]
                meta["routed_experts"] = base64.b64encode(
                    struct.pack(f"<{len(flat)}i", *flat)
                ).decode()
        ids = tokens[sent:]
        text = self.engine.tokenizer.decode(ids) if ids else ""
        return {"text": text, "output_ids": ids, "meta_info": meta}

    # -- LoRA adapters -------------------------------------------------------------------

    async def _use_adapter(self, name: str | None) -> None:
        """Put adapter ``name`` on the backing model; None: the base (the adapter layers
        already on the model zeroed). The backing engine's update drains its running
        requests first."""
        from slr.contracts.weights import WeightUpdate

        if name == self.applied:
            return
        if name is None:
            layers = self.on_model
            assert layers is not None and layers.lora is not None
            zero = {k: v * 0 for k, v in layers.items()}
            await self.engine.update_weights(
                WeightUpdate(tensors=zero, kind="lora", lora=layers.lora)
            )
        else:
            await self.engine.update_weights(self.adapters[name])
            self.on_model = self.adapters[name]
        self.applied = name

    def load_lora(self, body: Any) -> tuple[int, dict[str, Any]]:
        refused = _unknown(body, ACCEPTED_LOAD_LORA_FIELDS)
        if refused is not None:
            return refused
        from slr.engines.lora import read_adapter

        if not self.enable_lora:
            return _lora_failed("LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
        if not body.get("lora_name") or not body.get("lora_path"):
            return _error(400, "lora_name and lora_path are required")
        name = str(body["lora_name"])
        if name in self.adapters:
            return _lora_failed(
                f"LoRA with name {name} already exists. Loaded LoRAs: {list(self.adapters)}"
            )
        try:
            update = read_adapter(body["lora_path"])
        except Exception as exc:
            return _lora_failed(f"Failed to load LoRA adapter {name}: {exc}")
        assert update.lora is not None
        if update.lora.rank > self.max_lora_rank:
            return _lora_failed(
                f"LoRA adapter {name} has rank {update.lora.rank}, above --max-lora-rank "
                f"{self.max_lora_rank}"
            )
        self.adapters[name] = update
        self.adapter_paths[name] = str(body["lora_path"])
        loaded = {n: self.adapter_paths[n] for n in self.adapters}
        return 200, {"success": True, "error_message": None, "loaded_adapters": loaded}

    def unload_lora(self, body: Any) -> tuple[int, dict[str, Any]]:
        refused = _unknown(body, ACCEPTED_UNLOAD_LORA_FIELDS)
        if refused is not None:
            return refused
        name = str(body["lora_name"])
        self.adapter_paths.pop(name, None)
        if self.adapters.pop(name, None) is None:
            return _lora_failed(
                f"LoRA with name {name} does not exist. Loaded LoRAs: {list(self.adapters)}"
            )
        return 200, {"success": True, "error_message": None, "loaded_adapters": {}}

    def update_weight_version(self, body: Any) -> tuple[int, dict[str, Any]]:
        refused = _unknown(body, ACCEPTED_WEIGHT_VERSION_FIELDS)
        if refused is not None:
            return refused
        if "new_version" not in body:
            return _error(400, "new_version is required")
        if body.get("abort_all_requests", True):
            self.abort(None, abort_all=True)
        self.weight_version = str(body["new_version"])
        return 200, {
            "success": True,
            "message": f"Weight version updated to {self.weight_version}",
            "new_version": self.weight_version,
        }

    # -- weights -----------------------------------------------------------------------

    def update_from_disk(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        from safetensors.torch import load_file

        path = os.path.join(str(body.get("model_path", "")), "model.safetensors")
        if not os.path.isfile(path):
            return 400, {
                "success": False,
                "message": f"Failed to get weights iterator: {path} not found",
                "num_paused_requests": 0,
            }
        state_dict = load_file(path)
        self.call(self.engine.update_weights(state_dict))
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        return 200, {
            "success": True,
            "message": "Succeeded to update model weights.",
            "num_paused_requests": 0,
        }

    def init_group(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        refused = _unknown(body, ACCEPTED_INIT_GROUP_FIELDS)
        if refused is not None:
            return refused
        name = str(body.get("group_name", groups.DEFAULT_GROUP_NAME))
        if name in self.groups:
            return _failed(f"Failed to initialize custom process group: {name} exists.")
        try:
            self.groups[name] = groups.join_group(
                master_address=body["master_address"],
                master_port=int(body["master_port"]),
                rank=int(body["rank_offset"]),  # + this worker's tp_rank, 0: one worker
                world_size=int(body["world_size"]),
                group_name=name,
                backend=str(body.get("backend", "nccl")),
                timeout_s=60,
            )
        except Exception as exc:
            return _failed(f"Failed to initialize custom process group: {exc}.")
        return 200, {"success": True, "message": "Succeeded to initialize custom process group."}

    def update_from_distributed(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        refused = _unknown(body, ACCEPTED_DISTRIBUTED_FIELDS)
        if refused is not None:
            return refused
        name = str(body.get("group_name", groups.DEFAULT_GROUP_NAME))
        group = self.groups.get(name)
        if group is None:
            return _failed(
                f"Group {name} not in {list(self.groups)}. Please call "
                f"`init_weights_update_group` first."
            )
        try:
            received = groups.receive_bucket(group, body["dtypes"], body["shapes"])
            self._load(dict(zip(body["names"], received, strict=True)), body)
        except Exception as exc:
            return _failed(f"Failed to update parameter online: {exc}.")
        return 200, {"success": True, "message": "Succeeded to update parameter online."}

    def update_from_tensor(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        refused = _unknown(body, ACCEPTED_TENSOR_FIELDS)
        if refused is not None:
            return refused
        try:
            named = tensors.deserialize(body["serialized_named_tensors"][0])  # tp_rank 0
            self._load(dict(named), body)
        except Exception as exc:
            return _failed(f"Failed to update weights from tensor: {exc}.")
        return 200, {"success": True, "message": "Succeeded to update model weights."}

    def destroy_group(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        refused = _unknown(body, ACCEPTED_DESTROY_GROUP_FIELDS)
        if refused is not None:
            return refused
        group = self.groups.pop(str(body.get("group_name", groups.DEFAULT_GROUP_NAME)), None)
        if group is None:
            return _failed("The group to be destroyed does not exist.")
        groups.leave_group(group)
        return 200, {"success": True, "message": "Succeeded to destroy custom process group."}

    def _load(self, state_dict: dict[str, Any], body: dict[str, Any]) -> None:
        self.call(self.engine.update_weights(state_dict))
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])


def _unknown(body: Any, accepted: frozenset[str]) -> tuple[int, dict[str, Any]] | None:
    if not isinstance(body, dict):
        return _error(400, "the body must be a JSON object")
    unknown = set(body) - accepted
    return _error(400, f"stand-in does not accept {sorted(unknown)}") if unknown else None


async def _prepend(first: Any, rest: Any) -> AsyncIterator[Any]:
    """``first`` (unless None), then the rest of the async iterator ``rest``."""
    if first is not None:
        yield first
    async for item in rest:
        yield item


def _lora_failed(message: str) -> tuple[int, dict[str, Any]]:
    return 400, {"success": False, "error_message": message, "loaded_adapters": None}


def _failed(message: str) -> tuple[int, dict[str, Any]]:
    return 400, {"success": False, "message": message}


def _error(status: int, message: str) -> tuple[int, dict[str, Any]]:
    return status, {"error": {"message": message}}


def _handler(standin: SglangStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # keep test output clean
            pass

        def _send(self, status: int, payload: Any, *, text: bool = False) -> None:
            data = payload.encode() if text else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if text else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _record(self, body: Any = None) -> None:
            with standin.lock:
                standin.requests.append({"method": self.command, "path": self.path, "body": body})

        def do_GET(self) -> None:
            self._record()
            if self.path == "/health":
                self._send(200, "", text=True)
            elif self.path == "/get_model_info":
                self._send(
                    200,
                    {
                        "model_path": standin.served_model_name,
                        "tokenizer_path": None,
                        "is_generation": True,
                        "preferred_sampling_params": None,
                        "weight_version": standin.weight_version,
                    },
                )
            elif self.path == "/get_server_info":
                self._send(
                    200,
                    {
                        "model_path": standin.served_model_name,
                        "tp_size": 1,
                        "dp_size": 1,
                        "pp_size": 1,
                        "version": "stand-in",
                    },
                )
            elif self.path == "/standin/requests":
                with standin.lock:
                    recorded = list(standin.requests)
                self._send(200, recorded)
            elif self.path == "/v1/models":
                card = {
                    "id": standin.served_model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "sglang",
                    "root": standin.served_model_name,
                    "max_model_len": standin.context_length,
                }
                self._send(200, {"object": "list", "data": [card]})
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            self._record(body)
            if self.path == "/generate":
                self._generate(body)
            elif self.path == "/abort_request":
                body = body or {}
                standin.abort(body.get("rid"), bool(body.get("abort_all")))
                self._send(200, "", text=True)
            elif self.path == "/update_weights_from_disk":
                self._send(*standin.update_from_disk(body or {}))
            elif self.path == "/init_weights_update_group":
                self._send(*standin.init_group(body))
            elif self.path == "/update_weights_from_distributed":
                self._send(*standin.update_from_distributed(body))
            elif self.path == "/update_weights_from_tensor":
                self._send(*standin.update_from_tensor(body))
            elif self.path == "/destroy_weights_update_group":
                self._send(*standin.destroy_group(body))
            elif self.path == "/load_lora_adapter":
                self._send(*standin.load_lora(body))
            elif self.path == "/unload_lora_adapter":
                self._send(*standin.unload_lora(body))
            elif self.path == "/update_weight_version":
                self._send(*standin.update_weight_version(body))
            elif self.path == "/standin/hold_after":
                standin.hold_after = int((body or {})["tokens"])
                self._send(200, {})
            elif self.path == "/flush_cache":
                with standin.lock:
                    busy = bool(standin.running)
                self._send(400 if busy else 200, "Cache flushed.\n", text=True)
            else:
                self._send(404, {"detail": "Not Found"})

        def _generate(self, body: Any) -> None:
            refused = standin.check(body)
            if refused is not None:
                self._send(*refused)
                return
            rid, out = standin.start_request(body)
            state: dict[str, Any] = {"version": standin.weight_version, "started": time.monotonic()}
            tokens: list[int] = []
            lps: list[float] = []
            routing: list[Any] = []
            stream = bool(body.get("stream"))
            if stream:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
            try:
                while True:
                    kind, item = out.get()
                    if kind == "error":
                        status, message = item
                        if stream:
                            self._event({"error": {"message": message}})
                            self.wfile.write(b"data: [DONE]\n\n")
                        else:
                            self._send(*_error(status, message))
                        return
                    if kind == "chunk":
                        tokens += item.token_ids
                        lps += item.logprobs
                        if item.routed_experts is not None:
                            routing += item.routed_experts.tolist()
                        if item.finish_reason is not None or not (stream and item.token_ids):
                            continue
                    else:
                        state["reason"] = item
                        state["routing"] = routing
                    if stream:
                        self._event(standin.answer(rid, body, tokens, lps, state))
                        state["sent"] = len(tokens)
                    if kind == "end":
                        break
                if stream:
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                else:
                    self._send(200, standin.answer(rid, body, tokens, lps, state))
            except (BrokenPipeError, ConnectionResetError):
                standin.abort(rid)  # as SGLang aborts a request whose client left

        def _event(self, payload: dict[str, Any]) -> None:
            self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
            self.wfile.flush()

    return Handler


def main(argv: list[str]) -> None:
    """``python -m sglang.launch_server --model-path M --host H --port P [...]``."""
    record = os.environ.get("SGLANG_STANDIN_RECORD")
    if record:
        with open(record, "w") as f:
            env = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES",)}
            json.dump({"argv": argv, "pid": os.getpid(), "env": env}, f)
    if argv[:2] != ["-m", "sglang.launch_server"]:
        sys.exit(f"stand-in python only runs `-m sglang.launch_server`, got {argv}")
    args: dict[str, str] = {}
    rest = argv[2:]
    for i, item in enumerate(rest):
        if item.startswith("--"):
            nxt = rest[i + 1] if i + 1 < len(rest) else ""
            args[item] = "" if nxt.startswith("--") else nxt
    if os.environ.get("SGLANG_STANDIN_CRASH"):
        print("RuntimeError: stand-in crash on startup (CUDA out of memory)", flush=True)
        sys.exit(3)
    from slr_engine_hf.config import HfEngineConfig
    from slr_engine_hf.engine import HfEngine

    routed = "--enable-return-routed-experts" in args
    lora_rank = int(args.get("--max-lora-rank") or 0)
    engine = HfEngine(HfEngineConfig(model=args["--model-path"], return_routed_experts=routed))
    standin = SglangStandIn(
        engine,
        served_model_name=args.get("--served-model-name", args["--model-path"]),
        context_length=int(args["--context-length"]) if args.get("--context-length") else None,
        routed_experts=routed,
        enable_lora="--enable-lora" in args,
        max_lora_rank=lora_rank,
        host=args["--host"],
        port=int(args["--port"]),
    )
    print(f"INFO stand-in sglang: serving at {standin.url}", flush=True)
    threading.Event().wait()  # serve until killed (SIGTERM from the engine's close)


if __name__ == "__main__":
    main(sys.argv[1:])
