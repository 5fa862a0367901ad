"""Pricing a workload: whole conversations of request shapes or a finished bench run's own requests,
under every pricing model of llmopt/pricing.py, and the break-even points between them.

Reads nothing but llmopt.pricing: a run's records come in as the dicts that bench/rundir.py reads."""
