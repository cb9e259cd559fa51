"""verl's critic engine on the CPU platform: the value model loaded with the model's attention.

verl's FSDP critic (``FSDPEngineWithValueHead``) loads its value model through
``verl.utils.model.load_valuehead_model``, which asks transformers for
``attn_implementation="flash_attention_2"`` unconditionally (``verl/utils/model.py``, in
``load_valuehead_model``: the ``AutoModelForTokenClassification.from_pretrained`` call) and,
when flash-attn is missing, falls back to trl's value head (another package). Neither is
available on the CPU. verl's engine registry is its extension point for hardware vendors
(``EngineRegistry.register(..., vendor=...)``; ``get_engine_cls`` tries ``(device, vendor)``
first): this module registers, for this plugin's ``cpu`` platform (vendor ``cpu``), a
subclass of verl's critic engine that loads the same value model (a token-classification
head with one label, dropout off, as verl configures it) with the attention the model config
names (``[optimizer] attn_implementation``). Everything else is verl's engine.
"""

from __future__ import annotations

from typing import Any

from verl.workers.engine import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithValueHead

from slr_optimizer_verl.cpu_platform import PLATFORM


@EngineRegistry.register(
    model_type="value_model", backend=["fsdp", "fsdp2"], device="cuda", vendor=PLATFORM
)
class CPUValueEngine(FSDPEngineWithValueHead):
    """verl's ``FSDPEngineWithValueHead``, loading its value model without flash-attn."""

    def _build_module(self) -> Any:
        from transformers import AutoModelForTokenClassification
        from verl.utils.torch_dtypes import PrecisionType

        # set by verl's FSDPEngine.__init__ (undeclared on the class, so read through Any)
        engine: Any = self
        engine_config, model_config = engine.engine_config, engine.model_config
        dtype = PrecisionType.to_dtype(engine_config.model_dtype or "fp32")
        hf_config = model_config.hf_config
        # what verl's _build_module sets on a value model's config
        hf_config.num_labels = 1
        hf_config.classifier_dropout = 0.0
        hf_config.hidden_dropout = "0"
        hf_config.summary_dropout_prob = 0.0
        module = AutoModelForTokenClassification.from_pretrained(
            model_config.local_path,
            dtype=dtype,
            config=hf_config,
            trust_remote_code=model_config.trust_remote_code,
        )
        module.to(dtype)
        if model_config.enable_gradient_checkpointing:
            module.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        return module
