"""Named tensors handed to an SGLang server on the same machine, as
``/update_weights_from_tensor`` takes them.

SGLang reads ``serialized_named_tensors`` with its ``MultiprocessingSerializer``: a list of
``(name, tensor)`` pickled with ``multiprocessing.reduction.ForkingPickler``, base64 for
JSON (``python/sglang/srt/utils``; ``HttpServerEngineAdapter.update_weights_from_tensor``
in ``python/sglang/srt/entrypoints/http_server_engine.py`` sends it so). With torch's
reductions, that pickle carries no tensor data: a CUDA tensor travels as a CUDA IPC
handle, a CPU tensor as the name of a shared-memory segment. So the trainer and the server
must share the machine, and the sender keeps the tensors alive until the server answered.

CPU tensors are copied into fresh storage first (sharing moves a tensor's storage into
shared memory, and the trainer's own parameters should not move), and pickled under
torch's ``file_system`` sharing strategy: the default (``file_descriptor``) passes file
descriptors through the multiprocessing resource sharer, which only processes of one
``multiprocessing`` family (same authkey) can reach, while a named segment can be opened
by the separately launched server.
"""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

_STRATEGY_LOCK = threading.Lock()


@contextmanager
def _file_system_sharing() -> Iterator[None]:
    """torch's sharing strategy set to ``file_system`` for the block (it is process-wide:
    the lock keeps two serializations from restoring each other's setting)."""
    import torch.multiprocessing as tmp

    with _STRATEGY_LOCK:
        before = tmp.get_sharing_strategy()
        tmp.set_sharing_strategy("file_system")
        try:
            yield
        finally:
            tmp.set_sharing_strategy(before)


def serialize(bucket: Sequence[tuple[str, Any]]) -> tuple[str, list[tuple[str, Any]]]:
    """``bucket`` as one ``serialized_named_tensors`` entry, and the tensors it points at
    (keep them referenced until the server has answered)."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers torch's reductions with the pickler)

    shared = [(name, _shareable(t)) for name, t in bucket]
    buffer = io.BytesIO()
    with _file_system_sharing():
        ForkingPickler(buffer).dump(shared)
    return base64.b64encode(buffer.getvalue()).decode("ascii"), shared


def deserialize(payload: str | bytes) -> list[tuple[str, Any]]:
    """The ``(name, tensor)`` list one ``serialized_named_tensors`` entry names (what the
    server side does; used by the test stand-in)."""
    import pickle

    import torch.multiprocessing  # noqa: F401  (the rebuild functions the pickle names)

    data = base64.b64decode(payload, validate=True) if isinstance(payload, str) else payload
    return list(pickle.loads(data))


def _shareable(tensor: Any) -> Any:
    tensor = tensor.detach()
    return tensor if tensor.is_cuda else tensor.contiguous().clone()
