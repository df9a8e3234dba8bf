"""The Raft-replicated manager (HAMS §III-A; ../shared/ARCHITECTURE.md, Control plane).

``state`` is the replicated state machine (who holds which role at which epoch, the
decision log), ``service`` the replica process that runs it on pysyncobj inside Keel's
loop. Services and tools reach it through ``common.control``.
"""
