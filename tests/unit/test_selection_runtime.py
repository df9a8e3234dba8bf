"""The frontend's model selection at run time (services/selection/runtime.py) and the
cluster spec's applications (common/spec/applications.py): what a call selects, how an
answer is made and marked, what feedback learns and refuses, and what a spec may say."""
from __future__ import annotations

import time

import numpy as np
import pytest

from keel.common.config import FrontendConfig, ModelInfo
from keel.common.metrics import Metrics
from keel.common.protocol import ErrorCode, Source
from keel.common.spec import SpecError, load_spec
from keel.deploy.keel import main
from keel.services.selection.runtime import Applications

RIGHT, WRONG = np.array([0.0, 0.0, 1.0], np.float32), np.array([1.0, 0.0, 0.0], np.float32)


def apps_of(tmp_path, **app) -> Applications:
    cfg = FrontendConfig(models={m: ModelInfo([4], 3) for m in ("a", "b", "c")},
                         applications={"app": {"models": ["a", "b", "c"], "policy": "exp4", "params": {"eta": 0.3},
                                               **app}},
                         selection_store=str(tmp_path / "sel.sqlite"))
    return Applications(cfg, Metrics("frontend"))


def test_an_ensemble_answer_is_marked_by_what_arrived(tmp_path):
    apps = apps_of(tmp_path)
    models, call = apps.select("app", "alice")
    assert models == ("a", "b", "c")
    full = apps.combine(call, {"a": RIGHT, "b": RIGHT, "c": WRONG})
    assert full.source == Source.ENSEMBLE and full.confidence == pytest.approx(2 / 3) and np.argmax(full.output) == 2
    partial = apps.combine(call, {"a": RIGHT})  # b and c stragglers: they count as disagreeing
    assert partial.source == Source.PARTIAL and partial.models == ["a"] and partial.confidence == pytest.approx(1 / 3)
    assert apps.combine(call, {}) is None


def test_robust_answers_its_default_when_models_disagree(tmp_path):
    apps = apps_of(tmp_path, policy="robust", params={"eta": 0.3, "threshold": 0.9, "default_output": [0.5, 0.5, 0.0]})
    _, call = apps.select("app", "alice")
    low = apps.combine(call, {"a": RIGHT, "b": RIGHT, "c": WRONG})
    assert low.source == Source.LOW_CONFIDENCE and list(low.output) == [0.5, 0.5, 0.0]
    assert list(apps.default_output("app")) == [0.5, 0.5, 0.0]


def test_feedback_learns_once_refuses_the_unknown_and_persists(tmp_path):
    apps = apps_of(tmp_path)
    _, call = apps.select("app", "alice")
    call.outputs.update({"a": RIGHT, "b": RIGHT, "c": WRONG})
    apps.remember("r1", call)
    error, code = apps.feedback("r1", 7)  # not a class: refused, the entry kept
    assert code == ErrorCode.BAD_REQUEST and "0..2" in error
    assert apps.feedback("r1", 2) == (None, None)
    assert apps.feedback("r1", 2)[1] == ErrorCode.UNKNOWN_REQUEST  # once per call
    assert apps.feedback("nobody", 2)[1] == ErrorCode.UNKNOWN_REQUEST
    apps.close()
    again = apps_of(tmp_path)  # as after a restart: the store kept it
    w = again.policies["app"].weights(again.state("app", "alice"))
    assert w["c"] < w["a"] == pytest.approx(w["b"])
    fresh = again.policies["app"].weights(again.state("app", "bob"))
    assert fresh == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})


def test_late_feedback_is_refused(tmp_path):
    apps = apps_of(tmp_path)
    apps.log.ttl_s = 0.01
    _, call = apps.select("app", "alice")
    call.outputs["a"] = RIGHT
    apps.remember("r1", call)
    time.sleep(0.05)
    error, code = apps.feedback("r1", 2)
    assert code == ErrorCode.UNKNOWN_REQUEST and "0.01 s ago" in error


def spec(tmp_path, apps: dict, **models) -> dict:
    sleep = {"builtin": "sleep", "input_shape": [4], "output_size": 3}
    return {"cluster": {"run_dir": str(tmp_path / "run")},
            "models": {"a": sleep, "b": sleep, **models}, "applications": apps}


def test_the_spec_hands_every_frontend_its_applications_and_a_store_in_the_run_dir(tmp_path):
    s = load_spec(spec(tmp_path, {"ens": {"models": ["a", "b"], "deadline_ms": 20}}))
    fe = s.service("frontend").config
    assert fe.applications["ens"]["policy"] == "exp4" and fe.applications["ens"]["deadline_ms"] == 20
    assert fe.selection_store == str(tmp_path / "run" / "frontend-selection.sqlite")
    load_spec("deploy/examples/selection.toml")  # the example is a valid spec


@pytest.mark.parametrize("apps, models, message", [
    ({"a": {"models": ["a", "b"]}}, {}, "applications.a: is also a model's name"),
    ({"x": {"models": ["a", "c"]}}, {"c": {"builtin": "noop", "input_shape": [5], "output_size": 3}},
     "applications.x.models: must take the same input"),
    ({"x": {"models": ["a", "nope"]}}, {}, "unknown model 'nope'"),
    ({"x": {"models": ["a", "b"], "policy": "robust", "default_output": [1.0]}}, {},
     "applications.x.default_output: needs 3 values"),
])
def test_the_spec_refuses_applications_that_cannot_serve(tmp_path, apps, models, message):
    with pytest.raises(SpecError, match=message):
        load_spec(spec(tmp_path, apps, **models))


def test_applications_are_not_a_frontend_option(tmp_path):
    data = spec(tmp_path, {"ens": {"models": ["a", "b"]}})
    data["frontend"] = {"applications": {"x": {}}}
    with pytest.raises(SpecError, match="frontend.applications: applications are"):
        load_spec(data)


def test_show_finds_the_store_from_the_spec(tmp_path, capsys):
    data = spec(tmp_path, {"ens": {"models": ["a", "b"]}})
    path = tmp_path / "spec.toml"
    path.write_text(f'[cluster]\nrun_dir = "{tmp_path / "run"}"\n'
                    '[models.a]\nbuiltin = "sleep"\ninput_shape = [4]\noutput_size = 3\n'
                    '[models.b]\nbuiltin = "sleep"\ninput_shape = [4]\noutput_size = 3\n'
                    '[applications.ens]\nmodels = ["a", "b"]\n')
    fe = load_spec(data).service("frontend").config
    apps = Applications(fe, Metrics("frontend"))
    apps.state("ens", "alice")  # created on first use
    apps.close()
    assert main(["selection", "show", "ens", "--spec", str(path)]) == 0
    assert "alice: 0 feedback(s)  a=0.500  b=0.500" in capsys.readouterr().out


def test_metrics_count_choices_feedback_losses_confidence_missing_and_defaults(tmp_path):
    metrics = Metrics("frontend")
    apps = Applications(FrontendConfig(models={m: ModelInfo([4], 3) for m in "abc"},
                                       applications={"app": {"models": ["a", "b", "c"], "policy": "robust",
                                                             "params": {"eta": 0.3, "threshold": 0.5,
                                                                        "default_output": [0.5, 0.5, 0.0]}}}),
                        metrics)
    _, call = apps.select("app", "alice")
    call.outputs.update({"a": RIGHT, "b": WRONG})  # c missing; 1 of 3 agree: the default
    assert apps.combine(call, call.outputs).source == Source.LOW_CONFIDENCE
    apps.remember("r1", call)
    apps.feedback("r1", 2)

    def value(name, **labels):
        return metrics.registry.get_sample_value(f"keel_{name}", {"service": "frontend", **labels})

    assert value("selection_chosen_total", app="app", model="c") == 1
    assert value("selection_missing_total", app="app", model="c") == 1
    assert value("selection_low_confidence_total", app="app") == 1
    assert value("selection_confidence_count", app="app") == 1
    assert value("selection_feedback_total", app="app", model="b") == 1
    assert value("selection_feedback_loss_total", app="app", model="b") == 1
    assert value("selection_feedback_loss_total", app="app", model="a") == 0
    assert value("selection_weight", app="app", model="a") > value("selection_weight", app="app", model="b")


def test_a_failing_context_store_does_not_leave_a_call_unanswered(tmp_path):
    """A store that cannot be read or written (here: closed) costs the persistence of that
    learning, counted, never the call or the feedback."""
    apps = apps_of(tmp_path)
    apps.store.close()
    models, call = apps.select("app", "alice")
    answer = apps.combine(call, {m: RIGHT for m in models})
    assert answer is not None
    apps.remember("r1", call)
    assert apps.feedback("r1", 2) == (None, None)
    assert apps.m_store_errors.labels(op="read")._value.get() >= 1
    assert apps.m_store_errors.labels(op="write")._value.get() >= 1
