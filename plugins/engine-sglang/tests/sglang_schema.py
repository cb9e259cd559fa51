"""SGLang's request and response schema, as a table read from SGLang's own source.

Written by hand from the public repository sgl-project/sglang (main branch as stored in
late 2026; no release number is recorded in these files), never copied code:

- ``python/sglang/srt/managers/io_struct.py`` (commit 001067fffe33427bee0ed2f007fb7551a1d76b44):
  the fields of ``GenerateReqInput`` (the ``/generate`` body), ``AbortReq``,
  ``UpdateWeightFromDiskReqInput``, ``InitWeightsUpdateGroupReqInput``,
  ``UpdateWeightsFromDistributedReqInput`` (``names``, ``dtypes``, ``shapes``: the dtype
  names are read back with ``getattr(torch, name)``), ``UpdateWeightsFromTensorReqInput``
  (``serialized_named_tensors``: one base64 string per tensor-parallel rank) and
  ``DestroyWeightsUpdateGroupReqInput``, ``LoadLoRAAdapterReqInput`` (``lora_name``,
  ``lora_path``, ``pinned``, ``lora_id``), ``UnloadLoRAAdapterReqInput`` (``lora_name``,
  ``lora_id``) and ``UpdateWeightVersionReqInput`` (``new_version``,
  ``abort_all_requests``, True by default); every request inherits ``rid`` and
  ``http_worker_ipc`` from ``BaseReq``; the weight outputs are ``{success, message}``, the
  LoRA ones ``LoRAUpdateOutput`` (``success``, ``error_message``, ``loaded_adapters``);
  ``GenerateReqInput.lora_path`` names a loaded adapter per request;
- ``python/sglang/srt/model_executor/weight_updater.py`` (the stored version; no commit
  recorded): a worker joins the group as ``rank_offset + tp_rank`` and receives each named
  tensor as one ``broadcast(src=0)``, in order (``load_format = "flattened_bucket"`` would
  broadcast one flat tensor instead; the engine does not use it);
- ``python/sglang/srt/server_args.py``, not read at a commit: ``/get_server_info`` answers
  the ``ServerArgs`` fields, of which the engine reads ``tp_size``, ``dp_size``, ``pp_size``;
- ``docs/advanced_features/lora.ipynb`` (commit
  034b3be819faf3f84c5aae5a4cda27bdf2e12de0) and ``docs/advanced_features/server_arguments.md``
  (the stored version): the LoRA launch flags ``--enable-lora``, ``--max-lora-rank``,
  ``--lora-target-modules`` (module names or ``all``; needed, with the rank, when adapters
  are only loaded at run time), ``--max-loras-per-batch`` (the base counts as one),
  ``--lora-paths``; ``/generate`` names an adapter with ``lora_path`` = its name;
- ``python/sglang/srt/lora/lora_registry.py`` (commit
  5bf90e9dd2a3968df22212dc5f39ab46c55c4791): a name already loaded is refused ("LoRA with
  name ... already exists"), a request naming an adapter not loaded fails ("The following
  requested LoRA adapters are not loaded"), and an unload waits until no request uses the
  adapter;
- ``python/sglang/srt/sampling/sampling_params.py`` (commit
  00c17cafcb9e289d5ca97c50e44ada54e4fd5b03): the caller-facing ``SamplingParams`` fields
  (the "API parameters" block; not the internal ones set by ``normalize``);
- ``python/sglang/srt/managers/tokenizer_manager.py`` (commit
  001067fffe33427bee0ed2f007fb7551a1d76b44), ``_handle_batch_output`` and
  ``add_logprob_to_meta_info``: the keys of a ``/generate`` answer and its ``meta_info``;
- ``python/sglang/srt/utils/weight_versions.py``: ``weight_versions`` spans
  ``{"version", "start", "end"}``;
- ``python/sglang/srt/managers/schedule_batch.py``: ``finish_reason`` is ``None`` or
  ``{"type": "stop", "matched"}``, ``{"type": "length", "length"}``, ``{"type": "abort",
  "message", "status_code", "err_type"}``;
- ``python/sglang/srt/entrypoints/http_server.py`` (commit
  0025436eab0556737d615b36a4dd3e1e26e82f3d): the routes (``/load_lora_adapter`` and
  ``/unload_lora_adapter`` answer 200 on success, else 400, with ``LoRAUpdateOutput``;
  ``/update_weight_version``: ``success``, ``message``, ``new_version``) and the answers of
  ``/update_weights_from_disk`` (``success``, ``message``, ``num_paused_requests``) and
  ``/v1/models`` (cards with ``max_model_len``).

When SGLang changes these, update the table from its source, then the engine.
"""

GENERATE_REQUEST_FIELDS = frozenset(
    {
        "rid",
        "session_id",
        "text",
        "input_ids",
        "input_embeds",
        "image_data",
        "video_data",
        "audio_data",
        "mm_hashes",
        "mm_content_hashes",
        "use_audio_in_video",
        "video_config",
        "sampling_params",
        "return_logprob",
        "logprob_start_len",
        "top_logprobs_num",
        "token_ids_logprob",
        "return_sampling_mask",
        "return_text_in_logprobs",
        "return_flat_raw_top_logprobs",
        "return_flat_raw_top_logprobs_b64",
        "stream",
        "log_metrics",
        "return_hidden_states",
        "return_routed_experts",
        "routed_experts_start_len",
        "return_indexer_topk",
        "modalities",
        "session_params",
        "lora_path",
        "lora_id",
        "custom_logit_processor",
        "positional_embed_overrides",
        "bootstrap_host",
        "bootstrap_port",
        "bootstrap_room",
        "bootstrap_pair_key",
        "decode_tp_size",
        "routed_dp_rank",
        "data_parallel_rank",
        "disagg_prefill_dp_rank",
        "kv_router_hint",
        "routing_key",
        "conversation_id",
        "http_worker_ipc",
        "background",
        "require_reasoning",
        "max_thinking_tokens",
        "priority",
        "extra_key",
        "no_logs",
        "custom_labels",
        "return_bytes",
        "return_entropy",
        "return_prompt_token_ids",
        "external_trace_header",
        "received_time",
        "need_wait_for_mm_inputs",
        "num_items_assigned",
        "encoder_urls",
        "max_dynamic_patch",
        "min_dynamic_patch",
        "image_max_dynamic_patch",
        "video_max_dynamic_patch",
        "images_config",
        "multi_item_delimiter_indices",
        "cache_salt",
    }
)

SAMPLING_PARAMS_FIELDS = frozenset(
    {
        "max_new_tokens",
        "stop",
        "stop_token_ids",
        "stop_regex",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "n",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "custom_params",
        "stream_interval",
        "logit_bias",
        "sampling_seed",
    }
)

# A /generate answer (generation models): text is absent when the server skips the
# tokenizer; prompt_token_ids only with return_prompt_token_ids.
GENERATE_RESPONSE_KEYS = frozenset({"text", "output_ids", "meta_info", "prompt_token_ids"})

META_INFO_KEYS = frozenset(
    {
        # always
        "id",
        "finish_reason",
        "prompt_tokens",
        "weight_version",
        "num_retractions",
        "reasoning_tokens",
        "completion_tokens",
        "cached_tokens",
        # newer servers: spans of output tokens per weight version
        "weight_versions",
        "cached_tokens_details",
        "image_tokens",
        "audio_tokens",
        "video_tokens",
        # with return_logprob
        "input_token_logprobs",
        "output_token_logprobs",
        "output_token_logprobs_length",
        "input_top_logprobs",
        "output_top_logprobs",
        "input_token_ids_logprobs",
        "output_token_ids_logprobs",
        # with return_sampling_mask
        "output_token_sampling_mask",
        "output_token_sampling_logprobs",
        "output_token_sampling_mask_length",
        # optional captures
        "hidden_states",
        "routed_experts",
        "indexer_topk",
        "dp_rank",
        # when finished
        "e2e_latency",
    }
)

FINISH_REASON_KEYS = {
    "stop": frozenset({"type", "matched"}),
    "length": frozenset({"type", "length"}),
    "abort": frozenset({"type", "message", "status_code", "err_type"}),
}

WEIGHT_VERSION_SPAN_KEYS = frozenset({"version", "start", "end"})

ABORT_REQUEST_FIELDS = frozenset(
    {"rid", "http_worker_ipc", "abort_all", "finished_reason", "abort_message"}
)

UPDATE_WEIGHTS_FROM_DISK_FIELDS = frozenset(
    {
        "rid",
        "http_worker_ipc",
        "model_path",
        "load_format",
        "abort_all_requests",
        "weight_version",
        "is_async",
        "torch_empty_cache",
        "keep_pause",
        "recapture_cuda_graph",
        "token_step",
        "flush_cache",
        "manifest",
    }
)
UPDATE_WEIGHTS_FROM_DISK_RESPONSE_KEYS = frozenset({"success", "message", "num_paused_requests"})

_BASE_REQ = frozenset({"rid", "http_worker_ipc"})
INIT_WEIGHTS_UPDATE_GROUP_FIELDS = _BASE_REQ | {
    "master_address",
    "master_port",
    "rank_offset",
    "world_size",
    "group_name",
    "backend",
}
UPDATE_WEIGHTS_FROM_DISTRIBUTED_FIELDS = _BASE_REQ | {
    "names",
    "dtypes",
    "shapes",
    "group_name",
    "flush_cache",
    "abort_all_requests",
    "weight_version",
    "load_format",
    "torch_empty_cache",
}
UPDATE_WEIGHTS_FROM_TENSOR_FIELDS = _BASE_REQ | {
    "serialized_named_tensors",
    "load_format",
    "flush_cache",
    "abort_all_requests",
    "weight_version",
    "disable_draft_model",
    "torch_empty_cache",
}
DESTROY_WEIGHTS_UPDATE_GROUP_FIELDS = _BASE_REQ | {"group_name"}
LOAD_LORA_ADAPTER_FIELDS = _BASE_REQ | {"lora_name", "lora_path", "pinned", "lora_id"}
UNLOAD_LORA_ADAPTER_FIELDS = _BASE_REQ | {"lora_name", "lora_id"}
# LoRAUpdateOutput (BaseReq's fields may come along)
LORA_UPDATE_RESPONSE_KEYS = _BASE_REQ | {"success", "error_message", "loaded_adapters"}
UPDATE_WEIGHT_VERSION_FIELDS = _BASE_REQ | {"new_version", "abort_all_requests"}
UPDATE_WEIGHT_VERSION_RESPONSE_KEYS = frozenset({"success", "message", "new_version"})
# launch_server flags the engine passes for LoRA (server_arguments.md), and the values
# --lora-target-modules takes
LORA_LAUNCH_FLAGS = frozenset(
    {"--enable-lora", "--max-lora-rank", "--lora-target-modules", "--max-loras-per-batch"}
)
LORA_TARGET_MODULE_CHOICES = frozenset(
    {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
        "qkv_proj",
        "gate_up_proj",
        "all",
    }
)
# the answer of the group and distributed / tensor routes
WEIGHT_UPDATE_RESPONSE_KEYS = frozenset({"success", "message"})
SERVER_INFO_KEYS_READ = frozenset({"tp_size", "dp_size", "pp_size"})

# The routes slr-engine-sglang calls, with their methods in http_server.py.
ROUTES = {
    ("POST", "/generate"),
    ("POST", "/abort_request"),
    ("POST", "/update_weights_from_disk"),
    ("POST", "/init_weights_update_group"),
    ("POST", "/update_weights_from_distributed"),
    ("POST", "/update_weights_from_tensor"),
    ("POST", "/destroy_weights_update_group"),
    ("POST", "/load_lora_adapter"),
    ("POST", "/unload_lora_adapter"),
    ("POST", "/update_weight_version"),
    ("GET", "/get_server_info"),
    ("POST", "/flush_cache"),
    ("GET", "/health"),
    ("GET", "/get_model_info"),
    ("GET", "/v1/models"),
}
# http_server.py builds each card with id, root and max_model_len; object, created and
# owned_by are the OpenAI card's defaults (ModelCard in the OpenAI protocol module, not
# read for this table). The engine reads max_model_len only.
MODEL_CARD_KEYS = frozenset({"id", "object", "created", "owned_by", "root", "max_model_len"})
