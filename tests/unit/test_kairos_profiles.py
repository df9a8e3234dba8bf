"""Kairos profiles (common/kairos/profiles.py) against the authors' data and README."""
from __future__ import annotations

import numpy as np
import pytest

from common.kairos.profiles import (BASE_TYPE, DEFAULT_ROOT, QOS_MS, Profiles, batch_size_pmf,
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
