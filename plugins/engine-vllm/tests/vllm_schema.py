"""vLLM's completions schema, as a table read from vLLM's own source.

Written by hand from the public repository vllm-project/vllm (main branch as stored in
late 2026), never copied code: ``vllm/entrypoints/openai/completion/protocol.py`` (commit
002032ee2b18e1f7bd924ec47b62504ba3866063): the fields of ``CompletionRequest``,
``CompletionLogProbs``, ``CompletionResponseChoice``, ``CompletionResponse``,
``CompletionResponseStreamChoice`` and ``CompletionStreamResponse``.

Of note for this project (from the same file): ``routed_experts`` is a field of the
non-streaming choice only, a base64-encoded ``.npy`` array of shape (tokens - 1, layers,
experts per token); there is no request field to ask for it (the server's
``--enable-return-routed-experts`` decides; ``routed_experts_prompt_start`` skips prompt
positions). Unknown request fields are accepted and ignored by vLLM's base model, so a
misspelt field fails silently there: this table is how the tests catch one.
"""

COMPLETION_REQUEST_FIELDS = frozenset(
    {
        # OpenAI's
        "model",
        "prompt",
        "echo",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "n",
        "presence_penalty",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "suffix",
        "temperature",
        "top_p",
        "user",
        # vLLM's sampling params
        "use_beam_search",
        "top_k",
        "min_p",
        "repetition_penalty",
        "watermarking",
        "length_penalty",
        "stop_token_ids",
        "include_stop_str_in_output",
        "ignore_eos",
        "min_tokens",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "truncate_prompt_tokens",
        "truncation_side",
        "allowed_token_ids",
        "prompt_logprobs",
        "logprob_token_ids",
        "bad_words",
        # vLLM's extra params
        "prompt_embeds",
        "add_special_tokens",
        "response_format",
        "structured_outputs",
        "priority",
        "request_id",
        "session_id",
        "return_tokens_as_token_ids",
        "return_token_ids",
        "routed_experts_prompt_start",
        "return_token_offsets",
        "return_mm_kwargs",
        "cache_salt",
        "kv_transfer_params",
        "ec_transfer_params",
        "vllm_xargs",
        "repetition_detection",
        "thinking_token_budget",
        "stream_interval",
    }
)

LOGPROBS_KEYS = frozenset({"text_offset", "token_logprobs", "tokens", "top_logprobs"})

CHOICE_KEYS = frozenset(
    {
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "prompt_logprobs",
        "prompt_token_ids",
        "routed_experts",
    }
)
STREAM_CHOICE_KEYS = frozenset(
    {"index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids"}
)
RESPONSE_KEYS = frozenset(
    {
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
    }
)
STREAM_RESPONSE_KEYS = frozenset(
    {"id", "object", "created", "model", "choices", "usage", "system_fingerprint", "metrics"}
)
