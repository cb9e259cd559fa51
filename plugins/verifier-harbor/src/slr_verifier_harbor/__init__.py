"""slr-verifier-harbor: Harbor's verifier semantics (tests/test.sh -> /logs/verifier/reward.*)."""

from __future__ import annotations

from attrs import frozen, validators

import slr
from slr.config import option


@frozen(kw_only=True)
class HarborVerifierConfig:
    timeout_multiplier: float = option(
        1.0, doc="Scales every task's verifier timeout.", validator=validators.gt(0.0)
    )


@slr.hookimpl
def register_verifiers(register):
    register(
        "harbor", "slr_verifier_harbor.verifier:HarborVerifier", config_cls=HarborVerifierConfig
    )
