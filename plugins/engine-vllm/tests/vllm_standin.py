"""A STAND-IN for a vLLM server, for tests only: vLLM needs a GPU and cannot run here.

It answers the endpoints ``slr_engine_vllm`` uses with the response shapes of vLLM's
OpenAI-compatible server (``/health``, ``/v1/models``, ``/v1/completions`` with token-id
prompts and ``return_tokens_as_token_ids``, the dev-mode weight-transfer endpoints), and
records every request so tests can check what the client sent. It generates no real text:
each "sampled" token is the previous token + 1, with log-prob -0.25 per step.

Run as a script it is also the stand-in ``vllm`` executable: ``vllm serve MODEL --host H
--port P ...`` starts this server and writes its argv and environment to
``$VLLM_STANDIN_RECORD`` (tests put a ``vllm`` wrapper on PATH that runs this file).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


class StandInState:
    def __init__(
        self,
        *,
        served_model_name: str = "slr-policy",
        max_model_len: int = 64,
        vocab: int = 49152,
        return_token_ids: bool = True,
    ) -> None:
        self.served_model_name = served_model_name
        self.max_model_len = max_model_len
        self.vocab = vocab
        self.return_token_ids = return_token_ids  # newer vLLM lists sampled ids directly
        self.requests: list[dict] = []
        self.healthy = True
        self.fail_with: int | None = None  # answer completions with this HTTP status
        self.garble = False  # answer completions without logprobs
        self.world_size = 1
        self.routed_experts = False  # as launched with --enable-return-routed-experts
        self.lock = threading.Lock()


def completion(state: StandInState, body: dict) -> tuple[int, dict]:
    prompt = body.get("prompt")
    if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
        return 400, {
            "object": "error",
            "message": "prompt must be token ids here",
            "type": "BadRequestError",
            "code": 400,
        }
    if body.get("model") != state.served_model_name:
        return 404, {
            "object": "error",
            "message": f"The model `{body.get('model')}` does not exist.",
            "type": "NotFoundError",
            "code": 404,
        }
    if len(prompt) + 1 > state.max_model_len:
        return 400, {
            "object": "error",
            "message": f"This model's maximum context length is {state.max_model_len} tokens. "
            f"However, your request has {len(prompt)} input tokens. Please reduce the length "
            "of the input messages.",
            "type": "BadRequestError",
            "code": 400,
        }
    if state.fail_with is not None:
        return state.fail_with, {
            "object": "error",
            "message": "stand-in failure",
            "type": "InternalServerError",
            "code": state.fail_with,
        }
    ids, finish = [], "length"
    room = state.max_model_len - len(prompt)
    token = prompt[-1]
    for _ in range(min(body["max_tokens"], room)):
        token = (token + 1) % state.vocab
        ids.append(token)
        if token in body.get("stop_token_ids", []):
            finish = "stop"
            break
    logprobs = {
        "tokens": [
            f"token_id:{t}" if body.get("return_tokens_as_token_ids") else f"<{t}>" for t in ids
        ],
        "token_logprobs": [-0.25 * (i + 1) for i in range(len(ids))],
        "top_logprobs": [{f"token_id:{t}": -0.25 * (i + 1)} for i, t in enumerate(ids)],
        "text_offset": list(range(len(ids))),
    }
    choice = {
        "index": 0,
        "text": "".join(f"<{t}>" for t in ids),
        "logprobs": None if state.garble else logprobs,
        "finish_reason": finish,
        "stop_reason": None,
    }
    if state.return_token_ids and body.get("return_token_ids"):
        choice["token_ids"] = ids
    if state.routed_experts and not body.get("stream"):
        # vLLM: base64 of a .npy array (tokens - 1, layers, k), every token fed but the
        # last; non-streamed answers only (its stream choices have no such field)
        import base64
        import io

        import numpy as np

        fed = (prompt + ids)[:-1]
        buf = io.BytesIO()
        np.save(buf, np.array([[[t % 4, (t + 1) % 4]] for t in fed], dtype=np.int32))
        choice["routed_experts"] = base64.b64encode(buf.getvalue()).decode()
    return 200, {
        "id": "cmpl-standin",
        "object": "text_completion",
        "created": 0,
        "model": state.served_model_name,
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt) + len(ids),
        },
    }


def make_handler(state: StandInState):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep test output clean
            pass

        def _send(self, status: int, payload) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, payload: dict) -> None:
            """The completion as vLLM streams it: one SSE chunk per token, then [DONE]."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            choice = payload["choices"][0]
            ids = choice.get("token_ids")
            lp = choice["logprobs"]  # None when garbled: the chunks then lack log-probs
            n = len(lp["tokens"]) if lp else len(ids or ())
            for i in range(n):
                part = {
                    "index": 0,
                    "text": f"<{i}>",
                    "logprobs": lp
                    and {
                        "tokens": lp["tokens"][i : i + 1],
                        "token_logprobs": lp["token_logprobs"][i : i + 1],
                    },
                    "finish_reason": choice["finish_reason"] if i == n - 1 else None,
                }
                if ids is not None:
                    part["token_ids"] = ids[i : i + 1]
                chunk = {**payload, "object": "text_completion", "choices": [part]}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")

        def _record(self, body=None) -> dict:
            url = urlparse(self.path)
            entry = {
                "method": self.command,
                "path": url.path,
                "query": parse_qs(url.query),
                "body": body,
                "headers": dict(self.headers),
            }
            with state.lock:
                state.requests.append(entry)
            return entry

        def do_GET(self):
            entry = self._record()
            if entry["path"] == "/health":
                self._send(200 if state.healthy else 503, {})
            elif entry["path"] == "/v1/models":
                self._send(
                    200,
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": state.served_model_name,
                                "object": "model",
                                "max_model_len": state.max_model_len,
                            }
                        ],
                    },
                )
            elif entry["path"] == "/get_world_size":
                self._send(200, {"world_size": state.world_size})
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            entry = self._record(body)
            path = entry["path"]
            if path == "/v1/completions":
                status, payload = completion(state, body)
                if status == 200 and body.get("stream"):
                    self._stream(payload)
                else:
                    self._send(status, payload)
            elif path == "/pause":
                self._send(200, {"status": "paused"})
            elif path == "/resume":
                self._send(200, {"status": "resumed"})
            elif path == "/init_weight_transfer_engine":
                if not body or "init_info" not in body:
                    self._send(400, {"detail": "Missing 'init_info' in request body"})
                else:
                    self._send(200, {"message": "Weight transfer initialized"})
            elif path == "/update_weights":
                if not body or "update_info" not in body:
                    self._send(400, {"detail": "Missing 'update_info' in request body"})
                else:
                    self._send(200, {"message": "Weights updated"})
            else:
                self._send(404, {"detail": "Not Found"})

    return Handler


def start(state: StandInState, host: str = "127.0.0.1", port: int = 0):
    server = ThreadingHTTPServer((host, port), make_handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, f"http://{host}:{server.server_address[1]}"


def main(argv: list[str]) -> None:
    """``vllm serve MODEL --host H --port P [...]``, as the stand-in executable."""
    record = os.environ.get("VLLM_STANDIN_RECORD")
    if record:
        with open(record, "w") as f:
            json.dump(
                {
                    "argv": argv,
                    "pid": os.getpid(),
                    "env": {
                        k: os.environ[k]
                        for k in (
                            "VLLM_SERVER_DEV_MODE",
                            "CUDA_VISIBLE_DEVICES",
                            "VLLM_USE_V2_MODEL_RUNNER",
                        )
                        if k in os.environ
                    },
                },
                f,
            )
    if os.environ.get("VLLM_STANDIN_CRASH"):
        print("RuntimeError: stand-in crash on startup (CUDA out of memory)", flush=True)
        sys.exit(3)
    if argv[:1] != ["serve"]:
        sys.exit(f"stand-in vllm only knows `serve`, got {argv}")
    args: dict[str, str] = {}
    rest = argv[2:]
    for i, item in enumerate(rest):
        if item.startswith("--"):
            nxt = rest[i + 1] if i + 1 < len(rest) else ""
            args[item] = "" if nxt.startswith("--") else nxt
    state = StandInState(
        served_model_name=args.get("--served-model-name", argv[1]),
        max_model_len=int(args.get("--max-model-len", 64)),
    )
    state.routed_experts = "--enable-return-routed-experts" in args
    if os.environ.get("VLLM_STANDIN_CHILD"):  # a worker process, as vLLM spawns them
        import subprocess

        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        if record:
            with open(record + ".child", "w") as f:
                f.write(str(child.pid))
    print("INFO stand-in vllm: starting", flush=True)
    server = ThreadingHTTPServer((args["--host"], int(args["--port"])), make_handler(state))
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
