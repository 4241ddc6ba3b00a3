"""The command line, run in-process on the embedded model."""

from __future__ import annotations

import json

import pytest

from preproj.cli import main


@pytest.mark.integration
def test_inspect_reports_real_counts_cache_and_samples(tmp_path, capsys, smollm2):
    out = tmp_path / "inspect.json"
    assert main(["inspect", "--context", "64", "--new-tokens", "4", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["added"]["total"] == 34_836_480
    assert len(report["layers"]) == 30 and report["layers"][29]["attention"] == "model.layers.29.self_attn"
    assert report["kv_cache"]["base_bytes"] == report["kv_cache"]["adapted_bytes"] == 30 * 2 * 3 * 64 * 64 * 4
    assert report["samples"]["base"].strip()
    printed = capsys.readouterr().out
    assert "20.6% of base+new" in printed and "summary:" in printed


def test_bad_model_is_a_clear_error_not_a_traceback(tmp_path, capsys):
    assert main(["inspect", "--model", str(tmp_path)]) == 2
    assert "error: Could not load a model from directory" in capsys.readouterr().err


def test_a_stopped_run_is_told_the_command_that_continues_it():
    from preproj.cli import resume_command

    assert resume_command("train", ["train", "--out", "r x"]) == "preproj train --out 'r x' --resume"
    assert resume_command("pretrain", ["pretrain", "--resume"]) == "preproj pretrain --resume"
    assert resume_command("compare", ["compare", "--out", "c"]) == "preproj compare --out c"  # resumes by itself


def test_quiet_keeps_the_library_progress_lines_off_the_terminal(tmp_path, capsys):
    import logging

    from preproj.cli import _show_library_messages, build_parser

    for flags, shown in (([], True), (["--quiet"], False)):
        _show_library_messages(build_parser().parse_args(["paired", "a", "b", *flags]))
        logging.getLogger("preproj.experiments.compare").info("[compare] base seed 42 ...")
        assert ("[compare] base seed 42" in capsys.readouterr().out) == shown


def test_the_summary_line_reports_a_resumed_runs_whole_training_time():
    from preproj.cli import _training_time

    resumed = {"wall_seconds": 12.0, "train_seconds": 1800.0}  # this process trained the last few steps
    assert _training_time(resumed) == "1800s of training"
    assert _training_time({"wall_seconds": 12.0, "train_seconds": None}) == "12s in this process"


def test_the_summary_line_shows_a_compiled_runs_first_step_apart():
    from preproj.cli import _training_time

    compiled = {"wall_seconds": 90.0, "train_seconds": 80.0, "compiled": True, "first_step_seconds": 41.2,
                "median_step_seconds": 1.46}
    assert _training_time(compiled) == "80s of training (compiled: first step 41.2s, then 1.46s per step)"
    assert _training_time({**compiled, "compiled": False}) == "80s of training"


@pytest.mark.parametrize("command, table", [("train", "trained_methods"), ("pretrain", "pretrain_methods")])
def test_help_lists_every_method_the_command_accepts(command, table, capsys, monkeypatch):
    """--help and the refusal of an unknown method read the same table, registered methods included."""
    monkeypatch.setenv("COLUMNS", "10000")  # argparse wraps at hyphens too: one line per flag
    from preproj.methods import registry
    from preproj.training import scratch

    listed = (registry if table == "trained_methods" else scratch).__dict__[table]()
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    assert f"One of: {', '.join(listed)}." in text
    assert main([command, "--method", "banana"]) == 2
    assert ", ".join(listed) in capsys.readouterr().err
