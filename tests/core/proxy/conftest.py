import pytest


@pytest.fixture(scope="session")
def smol_tokenizer():
    """The real SmolLM2-135M-Instruct tokenizer (ChatML template, no native tool support)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(".cache/smollm2-tokenizer")
