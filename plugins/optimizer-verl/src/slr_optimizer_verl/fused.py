"""verl's fused log-prob path, and the one process-wide change it makes.

With ``model.use_fused_kernels`` verl's FSDP engine scores tokens through
``FusedLinearForPPO`` (``fused_kernel_options.impl_backend = "torch"``: plain torch, so it
runs on the CPU as on a GPU). To do so verl replaces the ``forward`` of the model's class
for the whole process (``verl/models/transformers/monkey_patch.py``,
``patch_forward_with_backends``: ``model.__class__.forward = forward_with_torch_backend``),
and the replacement answers only verl's engine (it raises without ``return_dict`` and
returns no logits). Any other model of that class in the same process (the hf engine
serving the same architecture) would be broken while the optimizer lives, so it belongs in
a process of its own (``[run] trainer_resources``). ``ClassForward`` remembers the class's
own ``forward`` before verl builds the model and puts it back when the optimizer closes, so
a closed optimizer leaves the process as it found it.
"""

from __future__ import annotations

from typing import Any

import attrs
import structlog

log = structlog.get_logger()

_MISSING = object()


@attrs.define
class ClassForward:
    """A model class's own ``forward`` (its ``__dict__`` entry), to put back on ``restore``."""

    cls: type | None
    forward: Any = _MISSING

    @classmethod
    def of(cls, worker_config: Any) -> ClassForward:
        """The class verl will build for ``worker_config``'s model (its auto class's pick)."""
        from verl.utils.model import get_hf_auto_model_class

        hf_config = worker_config.model_config.hf_config
        auto: Any = get_hf_auto_model_class(hf_config=hf_config)
        try:
            model_cls: Any = auto._model_mapping[type(hf_config)]
        except (KeyError, AttributeError, ValueError):
            return cls(None)
        log.warning(
            "optimizer.verl.fused_kernels",
            model_class=model_cls.__name__,
            note="verl replaces this class's forward in this process while the optimizer lives",
        )
        return cls(model_cls, model_cls.__dict__.get("forward", _MISSING))

    def restore(self) -> None:
        if self.cls is None:
            return
        if self.forward is _MISSING:
            if "forward" in self.cls.__dict__:
                delattr(self.cls, "forward")
        else:
            self.cls.forward = self.forward  # pyright: ignore[reportAttributeAccessIssue]
        self.cls = None
