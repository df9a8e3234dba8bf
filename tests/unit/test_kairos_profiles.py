"""Kairos profiles (common/kairos/profiles.py) against the authors' data and README."""
from __future__ import annotations

import numpy as np
import pytest

from keel.common.kairos.profiles import (BASE_TYPE, DEFAULT_ROOT, QOS_MS, Profiles, batch_size_pmf,
                                    sample_batch_sizes)

needs_data = pytest.mark.skipif(not (DEFAULT_ROOT / "data.tar.gz").exists(),
                                reason=f"Kairos profile data absent at {DEFAULT_ROOT}")


@pytest.fixture(scope="module")
def prof():
    return Profiles.load()


@needs_data
def test_every_type_and_model_present(prof):
    assert prof.types[0] == BASE_TYPE
    assert set(prof.types) == {"g4dn.xlarge", "c5n.2xlarge", "r5n.large", "t3.xlarge"}
    assert set(prof.models) == set(QOS_MS)
    assert list(prof.batches) == list(range(10, 1001, 10))
    assert not np.isnan(prof.service_ms).any()


@needs_data
def test_readme_sanity_figure_rm2_on_g4dn(prof):
    assert prof.latency_ms(BASE_TYPE, "rm2", 1000) == pytest.approx(260, rel=0.03)
    assert prof.latency_ms(BASE_TYPE, "rm2", 1000, inference_only=True) == pytest.approx(10.5, rel=0.03)


@needs_data
def test_latency_interpolates_and_scales_below_smallest(prof):
    l10, l20 = prof.latency_ms("t3.xlarge", "wnd", 10), prof.latency_ms("t3.xlarge", "wnd", 20)
    assert prof.latency_ms("t3.xlarge", "wnd", 15) == pytest.approx((l10 + l20) / 2)
    assert prof.latency_ms("t3.xlarge", "wnd", 5) == pytest.approx(l10 / 2)
    arr = prof.latency_ms("t3.xlarge", "wnd", np.array([10, 20]))
    assert arr.tolist() == pytest.approx([l10, l20])
    with pytest.raises(KeyError):
        prof.latency_ms("p3.2xlarge", "wnd", 10)


@needs_data
def test_coefficients_base_one_others_below(prof):
    for m in prof.models:
        assert prof.coefficient(BASE_TYPE, m) == 1.0
        for t in prof.types[1:]:
            assert 0 < prof.coefficient(t, m) < 1


@needs_data
def test_search_space_and_prices(prof):
    assert prof.search_types[0] == BASE_TYPE and prof.budget == 2.5
    assert prof.max_counts == [5, 6, 17, 15]
    assert prof.price("r5n.large") == pytest.approx(0.149)


def test_batch_size_mix_sampler_matches_pmf():
    sizes = sample_batch_sizes(50_000, np.random.default_rng(1))
    assert sizes.min() >= 1 and sizes.max() <= 1000
    pmf = batch_size_pmf()
    assert pmf.sum() == pytest.approx(1.0)
    for cut in (150, 220, 460, 800):
        assert (sizes < cut).mean() == pytest.approx(pmf[:cut - 1].sum(), abs=0.01)
    assert 140 < np.median(sizes) < 200    # the log-normal(5.1, 0.2) body dominates


def test_missing_profile_dir_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        Profiles.load(tmp_path)


def _fake_profile(root):
    """A tiny profile: one type, one model, batch sizes 10 and 20 (inference + loading)."""
    import io
    import json
    import tarfile

    files = {"data/fake.type/m_10_1.json": [1.0, 1.0, 9.0], "data/fake.type/m_20_1.json": [3.0, 3.0, 9.0],
             "data/logs_load/fake.type/m_10_1.json": [1.0, 1.0, 9.0],
             "data/logs_load/fake.type/m_20_1.json": [1.0, 1.0, 9.0]}
    with tarfile.open(root / "data.tar.gz", "w:gz") as tar:
        for name, samples in files.items():
            raw = json.dumps(samples).encode()
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return root


def test_fake_profile_trimmed_sum(tmp_path):
    prof = Profiles.load(_fake_profile(tmp_path))
    assert prof.types == ["fake.type"] and prof.models == ["m"]
    # summed 2, 2, 18: the 18 dropped -> 2 ms; at 20: 4, 4, 18 -> 4 ms
    assert prof.latency_ms("fake.type", "m", 10) == pytest.approx(2.0)
    assert prof.latency_ms("fake.type", "m", 15) == pytest.approx(3.0)
    assert prof.latency_ms("fake.type", "m", 10, inference_only=True) == pytest.approx(1.0)


def test_kairos_builtin_sleeps_profiled_time_per_query(tmp_path):
    import time

    from keel.common.config import ConfigError, WorkerConfig
    from keel.common.containers import KairosPredictor, build_predictor

    cfg = WorkerConfig(name="w", model="m", builtin="kairos", instance="fake.type", kairos_model="m",
                       kairos_scale=10.0, kairos_profile=str(_fake_profile(tmp_path)), builtin_input_shape=[4],
                       builtin_output_size=3)
    cfg.validate()
    pred = build_predictor(cfg)
    assert isinstance(pred, KairosPredictor)
    batch = np.zeros((3, 4), np.float32)
    batch[:, 0] = [10, 20, 5]                    # 2 + 4 + 1 ms, times 10
    assert pred.service_ms(batch) == pytest.approx(70.0)
    start = time.perf_counter()
    out = pred.predict_batch(batch)
    assert time.perf_counter() - start >= 0.069
    assert out.shape == (3, 3) and not out.any()
    with pytest.raises(ConfigError):
        WorkerConfig(name="w", builtin="kairos", kairos_model="m").validate()     # no instance type
    with pytest.raises(KeyError):
        KairosPredictor("other.type", "m", 1.0, str(tmp_path), [4], 3)
