from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random Llama (SmolLM2's tokenizer and vocabulary) saved as a model folder."""
    from slr_engine_hf.models import ensure_tokenizer
    from slr_optimizer_torch.testing import tiny_causal_lm

    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = Path(ensure_tokenizer("smollm2-135m-instruct"))
    model = tiny_causal_lm(vocab_size=49152, hidden_size=32, layers=2, seed=3, init_std=0.2)
    model.save_pretrained(folder, safe_serialization=True)
    for file in tokenizer.iterdir():
        if file.is_file() and not (folder / file.name).exists():
            shutil.copy2(file, folder / file.name)
    return folder
