"""Kairos (HPDC 2023): heterogeneous pools; profiles and the pool planner (§5.2)."""
