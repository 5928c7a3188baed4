"""The bench scripts run (tiny sizes, `--smoke`) and produce their tables and JSON.

Not a measurement: this only keeps bench/ from rotting. Each script runs in
its own process, as a user runs it.
"""

import json
import os
import pathlib
import subprocess
import sys

import limits
import pytest

pytestmark = pytest.mark.slow

BENCH = pathlib.Path(__file__).resolve().parent.parent / "bench"


def run_smoke(tmp_path, script, *extra):
    out = tmp_path / "out.json"
    command = [sys.executable, str(BENCH / script), "--smoke", "--json", str(out), *extra]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=limits.CHILD_S,
        cwd=tmp_path,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert result.returncode == 0, (
        f"{script} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    results = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert results, result.stdout
    payload = json.loads(out.read_text())
    assert payload["rows"] and payload["machine"]["cpus"]
    return payload["rows"]


def test_log_event_bench_compares_variants_and_baseline(tmp_path):
    pytest.importorskip("tensorflow")
    rows = run_smoke(tmp_path, "bench_log_event.py", "--summary", "current,null")
    assert [row["summary"] for row in rows] == ["current", "null"]
    for row in rows:
        assert row["log_event_s"] > 0 and row["train_step_s"] > 0 and row["baseline_s"] > 0
        assert row["tensors"] == 3 * row["n_layers"]


def test_fit_bench_reports_overhead(tmp_path):
    pytest.importorskip("tensorflow")
    (row,) = run_smoke(tmp_path, "bench_fit.py")
    assert row["fit_with_s"] > 0 and row["fit_without_s"] > 0


def test_disk_bench_measures_growth_per_event(tmp_path):
    pytest.importorskip("tensorflow")
    (row,) = run_smoke(tmp_path, "bench_disk.py")
    # Metadata goes out with the first event only, so later events are smaller and all alike.
    assert row["growth_min"] == row["growth_max"] < row["first_event_bytes"]
    assert 0 < row["bytes_per_tensor_per_event"] < 4096
    # An event with the digest only is a small share of one with the full records.
    assert 0 < row["digest_min"] <= row["digest_max"] < row["bytes_per_event"] / 10
    assert row["full_events_of_10000"] == 240


def test_plugin_bench_serves_both_loaders(tmp_path):
    extra = []
    try:
        import playwright  # noqa: F401
    except ImportError:
        extra = ["--no-browser"]
    if not os.path.exists("/usr/bin/chromium"):
        extra = ["--no-browser"]
    rows = run_smoke(tmp_path, "bench_plugin.py", "--cache", str(tmp_path / "logs"), *extra)
    assert [row["loader"].split()[0] for row in rows] == ["python", "rust"]
    for row in rows:
        assert row["series_warm_p50_ms"] > 0 and row["peak_rss_mb"] > 0
        if not extra:
            assert row["browser_layer_view_s"] > 0 and row["browser_grid_s"] > 0


def test_statistics_bench_takes_an_event_apart(tmp_path):
    pytest.importorskip("tensorflow")
    kernels_row, crc_row, event_row = run_smoke(tmp_path, "bench_statistics.py")
    assert kernels_row["float32_kernel_ms"] > 0 and kernels_row["compile_float32_s"] > 0
    assert crc_row["google_crc32c_ms_per_mb"] > 0 and crc_row["tensorboard_ms_per_mb"] > 0
    # The tiny CNN with all 7 layers: 21 tensors, of which 6 shared gradients are summarised once.
    assert event_row["items"] == 15 and event_row["bytes_held"] == 4 * event_row["values"]


def test_backends_bench_measures_each_backend_in_its_own_process(tmp_path):
    rows = run_smoke(
        tmp_path, "bench_backends.py", "--backends", "jax,torch", "--statistics", "host,device"
    )
    assert [(r["backend"], r["layers"], r["statistics"]) for r in rows] == [
        (backend, layers, statistics)
        for backend in ("jax", "torch")
        for layers in ("pool", "all")
        for statistics in ("host", "device")
    ]
    for row in rows:
        assert (
            row["log_event_s"] > 0
            and row["train_step_s"] > 0
            and row["tensors"] == 3 * row["n_layers"]
        )


def test_routing_map_bench_measures_bytes_and_time(tmp_path):
    pytest.importorskip("tensorflow")
    (row,) = run_smoke(tmp_path, "bench_routing_map.py")
    assert row["log_event_s"] > 0 and row["log_event_with_map_s"] > 0
    assert 0 < row["largest_map_bytes"] <= 64 * 1024 + 512 < row["event_bytes"] + 64 * 1024


def test_weights_bench_compares_with_and_without_on_each_backend(tmp_path):
    pytest.importorskip("tensorflow")
    rows = run_smoke(tmp_path, "bench_weights.py", "--backends", "tensorflow")
    assert [(r["backend"], r["layers"]) for r in rows] == [
        ("tensorflow", "pool"),
        ("tensorflow", "all"),
    ]
    pool, every = rows
    # Pooling layers have no weights: the option adds no tensor and holds nothing.
    assert (
        pool["weights"] == 0
        and pool["tensors_with"] == pool["tensors_without"]
        and pool["update_bytes_held"] == 0
    )
    # The tiny CNN with all 7 layers: kernel and bias of 3 convs and the head, 2 tensors each.
    assert every["weights"] == 8 and every["tensors_with"] == every["tensors_without"] + 16
    assert every["update_bytes_held"] == 4 * every["weight_values"] > 0
    for row in rows:
        assert row["event_with_s"] > 0 and row["event_without_s"] > 0 and row["train_step_s"] > 0
        assert row["updates_with_s"] >= 0 and row["pass_with_s"] > 0


def test_precision_bench_times_the_statistics_with_and_without_the_record(tmp_path):
    pytest.importorskip("tensorflow")
    (row,) = run_smoke(tmp_path, "bench_precision.py")
    # The tiny CNN with all 7 layers: 15 summarised tensors, each timed both ways.
    assert row["tensors"] == 15
    for clock in ("wall", "cpu"):
        assert row[f"{clock}_statistics_with_s"] > 0 and row[f"{clock}_statistics_without_s"] > 0
        assert row[f"{clock}_event_s"] > 0
    assert len(row["load_before"]) == len(row["load_after"]) == 3


def test_long_run_bench_measures_the_digest_and_the_timeline(tmp_path):
    digest_row, long_row = run_smoke(tmp_path, "bench_long_run.py")
    assert digest_row["part"] == "digest" and digest_row["digest_bytes"] == 3 * 3 * 28
    assert long_row["steps"] == 50 and long_row["timeline_warm_s"] > 0


def test_long_run_bench_serves_the_run_with_tensorboard(tmp_path):
    (row,) = run_smoke(tmp_path, "bench_long_run.py", "--parts", "tensorboard")
    assert row["part"] == "tensorboard" and row["timeline_steps"] == 50
    assert row["peak_rss_mb"] >= row["rss_after_load_mb"] > 0


def test_budget_bench_reads_back_what_the_budget_did(tmp_path):
    (row,) = run_smoke(tmp_path, "bench_budget.py")
    assert row["budget"] == 0.02 and row["steps"] == 40
    assert 0 < row["share_whole_fit"] < 1 and row["interval_max"] >= 1


def test_check_bench_times_check_and_step_on_a_long_run(tmp_path):
    text, json_row, step = run_smoke(tmp_path, "bench_check.py")
    assert (text["part"], json_row["part"], step["part"]) == ("check_text", "check_json", "step")
    assert text["status"] == json_row["status"] == 0 and text["peak_rss_mb"] > 0
    assert step["step_layers"] == 3 and step["step_cold_s"] > 0


@pytest.mark.browser
def test_tab_browser_bench_times_the_first_render_and_a_step_change(tmp_path):
    (row,) = run_smoke(tmp_path, "bench_tab_browser.py")
    assert row["steps"] == 50 and row["step_changes"] == 2 and row["time_view_columns"] == 50
    assert 0 < row["step_change_median_s"] <= row["step_change_max_s"] < row["first_render_s"] + 60


@pytest.mark.browser
def test_series_bench_times_the_downsampled_route_and_the_layer_view(tmp_path):
    (row,) = run_smoke(tmp_path, "bench_series.py")
    assert row["steps"] == 1200 and row["page_errors"] == []
    # 1,200 steps in at most 300 columns: downsampled, and far smaller than every step.
    assert 0 < row["spread_columns"] <= 300
    assert row["series_input_gradient_bytes"] < row["series_input_gradient_whole_bytes"] / 2
    assert row["warm_layer_change_s"] > 0 and row["first_render_s"] > 0


def test_divergence_bench_runs_each_kind_of_model_and_rejudges_its_logdirs(tmp_path):
    pytest.importorskip("tensorflow")
    cases = "cnn_lr_ramp,transformer_high_lr,mixed_overflow,tanh_adam_ramp,rnn_healthy"
    logdirs, table = tmp_path / "logdirs", tmp_path / "table.md"
    rows = run_smoke(
        tmp_path,
        "bench_divergence.py",
        *("--cases", cases, "--logdirs", str(logdirs), "--table", str(table)),
    )
    assert [row["case"] for row in rows] == cases.split(",")
    assert [row["set"] for row in rows] == ["tuning"] * 3 + ["held_back"] * 2
    for row in rows:
        # 30 steps end before the learning rate starts to grow: nothing diverges.
        assert row["steps_run"] == 30 and row["divergence_step"] is None
        assert row["every_n_batches"] == 10 and row["logged_steps"] == 3 and row["seed"] == 0
        assert row["logdir"] == str(logdirs / row["set"] / f"{row['case']}_seed0_every10")
        assert isinstance(row["onsets"], list)
    assert "### Set `tuning`" in table.read_text() and "### Set `held_back`" in table.read_text()
    # Judged again from the kept logdirs, by the same rules: the same rows.
    again = run_smoke(tmp_path, "bench_divergence.py", "--rejudge", str(tmp_path / "out.json"))
    for row in rows + again:
        assert isinstance(row.pop("check_seconds"), float)
    assert again == rows


def test_indicators_bench_times_the_judging_of_flags_and_warnings_in_a_log_event(tmp_path):
    pytest.importorskip("tensorflow")
    (row,) = run_smoke(tmp_path, "bench_indicators.py", "--model", "cnn")
    # The smoke window: 5 events 20 steps apart, then 6 (a window of 100 steps holds both ends).
    assert row["n_layers"] == 7 and row["history_events"] in (5, 6)
    # The warnings are part of the judging, and the rules part of the warnings.
    assert 0 < row["rules_wall_s"] <= row["warnings_wall_s"] <= row["judge_wall_s"]
    assert row["event_without_wall_s"] > 0 and row["keeper_flags_wall_s"] > 0


def test_real_fit_bench_names_the_onset_of_its_nan(tmp_path):
    """30 steps of a 4-convolution CNN, a NaN put into c2's kernel at step 20: check and a plain
    tensorboard's /onset name step 20, c2's activation, whose full records /step serves."""
    (row,) = run_smoke(tmp_path, "bench_real_fit.py", "--logdir", str(tmp_path / "run"))
    assert row["steps"] == 30 and row["logged_layers"] == 7 and row["check_exit"] == 1
    for onset in (row["check_nonfinite"], row["onset_nonfinite"]):
        assert (onset["step"], onset["layer"], onset["tensor"]) == (20, "c2", "activation")
    assert row["onset_steps_judged"] == 30
    assert row["full_records_at_onset"] == dict.fromkeys(
        ("activation", "input_gradient", "output_gradient"), True
    )


def test_full_event_bench_times_the_event_with_and_without_the_block_part(tmp_path):
    pytest.importorskip("tensorflow")
    (row,) = run_smoke(tmp_path, "bench_full_event.py", "--part", "host")
    assert row["tensors"] == 6 and row["event_blocks_wall_s"] > 0 and row["event_casts_wall_s"] > 0
    assert row["host_fused_cpu_s"] >= 0 and row["train_wall_s"] > 0


def test_in_step_bench_pairs_fits_with_and_without_the_in_step_digest(tmp_path):
    pytest.importorskip("tensorflow")
    (row,) = run_smoke(tmp_path, "bench_in_step.py", "--layers", "all")
    assert row["chosen"] > 5 and row["in_step_events"] > 0
    assert row["ratio_median"] > 0 and row["cpu_ratio_median"] > 0


def test_in_step_updates_bench_times_the_step_with_and_without_the_update_rows(tmp_path):
    pytest.importorskip("tensorflow")
    (row,) = run_smoke(tmp_path, "bench_in_step_updates.py", "--layers", "all")
    assert row["update_rows"] == {"step": row["weights"], "no_updates": 0} and row["weights"] > 0
    assert row["updates_ratio"] > 0 and row["cpu_updates_ratio"] > 0


def test_in_step_parts_bench_times_each_part_of_a_logged_step(tmp_path):
    pytest.importorskip("tensorflow")
    (row,) = run_smoke(tmp_path, "bench_in_step_parts.py")
    assert row["layers"] == 7  # the small CNN's every layer
    for part in ("kernel_rows_ms", "update_norms_ms", "callback_event_ms", "judge_ms"):
        assert row[part] > 0, part


def test_in_step_memory_bench_takes_each_arms_peak_in_a_process_of_its_own(tmp_path):
    pytest.importorskip("tensorflow")
    (row,) = run_smoke(tmp_path, "bench_in_step_memory.py", "--layers", "all")
    for arm in ("plain", "step"):
        assert row[f"{arm}_peak_mb"] >= row[f"{arm}_before_fit_mb"] > 0
        assert row[f"{arm}_step_peak_mb"] > row[f"{arm}_step_added_mb"] >= 0
    assert row["peak_ratio"] > 0 and row["fit_added_ratio"] > 0


def test_in_step_kernel_bench_times_the_kernel_hot_cold_and_against_one_read(tmp_path):
    (row,) = run_smoke(tmp_path, "bench_in_step_kernel.py")
    assert row["tensors"] == 4 and row["values"] == 4 * 4 * 8 * 8 * 64
    for speed in ("hot_gvalues_s", "cold_gvalues_s", "read_gvalues_s"):
        assert row[speed] > 0, speed


def test_block_chunks_bench_times_a_chunks_call_and_the_fused_block_part(tmp_path):
    from tb_gradviz.capture import block_counts

    (row,) = run_smoke(tmp_path, "bench_block_chunks.py")
    assert row["chunk"] == block_counts.CHUNK and row["fused_values"] == 196608
    for length in (32, 128, 1024, block_counts.CHUNK):
        assert row[f"call_ns_{length}"] > 0, length
    assert row["fused_with_ns_per_value"] > 0 and row["fused_without_ns_per_value"] > 0
