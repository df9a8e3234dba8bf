"""Kairos (HPDC 2023): heterogeneous pools. ``profiles``: the authors' measured latencies;
``planner``: the pool planner (§5.2). The distribution policies are dispatcher plug-ins
(``services.scheduling.kairos``); ``bench.kairos_sim`` runs them on a virtual clock."""
