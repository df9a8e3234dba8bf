"""``keel selection show``: the weights a policy learned, read back from the context store
file after the writer closed it (as after a frontend restart)."""
from __future__ import annotations

import numpy as np

from keel.deploy.keel import main
from keel.services.selection.contexts import ContextStore
from keel.services.selection.policies import Exp4


def test_show_prints_each_contexts_learned_weights(tmp_path, capsys):
    policy = Exp4(["good", "bad"])
    store = ContextStore(tmp_path / "sel.sqlite")
    state = policy.init()
    right, wrong = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    for _ in range(20):  # "good" always right, "bad" always wrong
        state = policy.observe(state, None, 0, {"good": right, "bad": wrong})
    store.put("ens", "alice", state.to_dict(), now=1e12)  # far future: not expired when read
    store.put("ens", "bob", policy.init().to_dict(), now=1e12)
    store.close()
    spec = tmp_path / "spec.toml"
    spec.write_text('[applications.ens]\nmodels = ["good", "bad"]\npolicy = "exp4"\n')

    assert main(["selection", "show", "ens", "--store", str(tmp_path / "sel.sqlite"), "--spec", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "2 context(s)" in out
    alice = next(line for line in out.splitlines() if "alice" in line)
    bob = next(line for line in out.splitlines() if "bob" in line)
    assert "20 feedback(s)" in alice and "good=0.99" in alice  # e^{-6} ~ weight of "bad" bounded by spread 5
    assert "good=0.500  bad=0.500" in bob

    main(["selection", "show", "ens", "--store", str(tmp_path / "sel.sqlite"), "--context", "carol"])
    assert "carol: no state" in capsys.readouterr().out
    main(["selection", "show", "ens", "--store", str(tmp_path / "missing.sqlite")])
    assert "no context store" in capsys.readouterr().out
