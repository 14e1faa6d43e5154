"""Rollout collection: engines behind one protocol, weight sync with its probe gate, the multi-turn loop."""
