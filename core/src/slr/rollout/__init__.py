"""Rollout: one trial (sandbox, agent, verifier), its costs, and the recorder that keeps every trial once."""
