"""Wrong paths and keys given to the commands are one-line errors naming the option, exit code 2, no traceback.

Every command that loads a trained model takes ``RUN`` or ``RUN/final`` (``kimi_vl.exports.export_folder``)."""

from __future__ import annotations

import pytest

from kimi_vl.exports import export_folder


def test_run_or_final_resolve_to_the_export(tmp_path) -> None:
    final = tmp_path / "run" / "final"
    final.mkdir(parents=True)
    (final / "config.json").write_text("{}")
    assert export_folder(tmp_path / "run") == final
    assert export_folder(str(final)) == final


def test_missing_or_wrong_folder_names_the_option(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"init_from='.*nope': no such folder \(expected an export"):
        export_folder(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=r"--checkpoint='.*': no config.json there"):
        export_folder(tmp_path, "--checkpoint")


def test_eval_loader_names_the_checkpoint(tmp_path) -> None:
    from eval.lm_eval_model import load_checkpoint

    with pytest.raises(FileNotFoundError, match=r"checkpoint='.*missing': no such folder"):
        load_checkpoint(str(tmp_path / "missing"))


def test_demo_heldout_names_the_bad_input(tmp_path, capsys) -> None:
    from kimi_vl.cli import main as kimi_vl_main

    export = tmp_path / "run" / "final"
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    for args, message in (([str(tmp_path / "none")], "--checkpoint='"),
                          ([str(tmp_path / "run"), "--data", str(tmp_path)], "no manifest.json there"),
                          ([str(tmp_path / "run"), "--data", "synth:nosuch"], "--data='synth:nosuch': expected")):
        with pytest.raises(SystemExit) as exit_:
            kimi_vl_main(["demo", "heldout", "--checkpoint", *args, "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and message in err and "usage: kimi-vl demo heldout" in err


@pytest.mark.parametrize("task, flag", [("video2web", "--video"), ("screenshot2web", "--image")])
def test_demo_cli_rejects_missing_inputs_before_loading(task, flag, tmp_path, capsys) -> None:
    from kimi_vl.cli import main as kimi_vl_main

    clip = tmp_path / "clip.bin"
    clip.write_bytes(b"x")
    none, ckpt = str(tmp_path / "none.mp4"), ["--checkpoint", str(tmp_path)]
    cases = [
        ([flag, none, *ckpt], f"{flag} {none}: no such file"),
        ([flag, str(clip), *ckpt, "--reference", "gone.html"], "--reference gone.html: no such file"),
        ([flag, str(clip), "--checkpoint", str(tmp_path / "run")], "--checkpoint='"),
    ]
    for args, message in cases:
        with pytest.raises(SystemExit) as exit_:
            kimi_vl_main(["demo", task, *args, "--out", str(tmp_path / "out")])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("override, message", [
    ("init_from={tmp}/run", "init_from='"),
    ("data.path={tmp}", "no manifest.json"),
    ("bogus=1", "unknown key 'bogus'"),
    ("data.path=synth:nosuch", "expected synth:PRESET[:SEED]"),
])
def test_rl_cli_names_the_bad_input(override, message, tmp_path, capsys) -> None:
    from rl.trainer import main as rl_main

    args = ["--config", "tiny_rl", f"output_dir={tmp_path / 'out'}", "init_from="]  # a shipped config's name
    assert rl_main([*args, override.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_ablate_cli_names_the_bad_input(tmp_path, capsys) -> None:
    from eval.ablation.cli import main as ablate_main

    assert ablate_main([str(tmp_path / "none.yaml"), "--out", str(tmp_path / "out")]) == 2
    assert "experiment file not found" in capsys.readouterr().err
    assert ablate_main(["kimi_vl/configs/ablation_smoke.yaml", "bogus=3", "--out", str(tmp_path / "out")]) == 2
    assert "unknown key 'bogus'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_eval_cli_names_the_bad_input(tmp_path, capsys) -> None:
    from eval.cli import EvalInputError, check_tasks
    from eval.cli import main as eval_main

    with pytest.raises(EvalInputError, match=r"'kimi_text_mcq': did you mean \['kimi_text_mc'"):
        check_tasks(["kimi_text_mcq", "kimi_text"], ["kimi_text", "kimi_text_mc", "arc_easy"], ["suites"])
    with pytest.raises(SystemExit) as exit_:  # an empty task folder: no task is known, before any model loads
        eval_main(["--tasks", "kimi_text", "--include_path", str(tmp_path)])
    assert exit_.value.code == 2 and "--tasks: unknown 'kimi_text'" in capsys.readouterr().err

    for args, message in ((["--model_args", f"checkpoint={tmp_path / 'run'}"], "--model_args checkpoint='"),
                          (["--include_path", str(tmp_path / "suites")], "suites: not a directory")):
        with pytest.raises(SystemExit) as exit_:
            eval_main(["--tasks", "kimi_text", *args])
        assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--from-hf", "--to-hf"])
def test_convert_cli_names_the_bad_input(flag, tmp_path, capsys) -> None:
    from kimi_vl.convert import main as convert_main

    for folder, message in ((tmp_path / "none", "none: no such folder"), (tmp_path, "no config.json there")):
        with pytest.raises(SystemExit) as exit_:
            convert_main([flag, str(folder), "--out", str(tmp_path / "out")])
        assert exit_.value.code == 2 and f"{flag} " in (err := capsys.readouterr().err) and message in err


def test_swarm_cli_names_the_bad_input(tmp_path, capsys) -> None:
    from rl.swarm.experiment import main as swarm_main

    assert swarm_main(["--config", str(tmp_path / "none.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_rl_takes_the_tokenizer_of_the_init_export(tmp_path) -> None:
    from kimi_vl.runconfig import load_config
    from rl.build import check_inputs
    from rl.config import RLRunConfig

    data, export = tmp_path / "data", tmp_path / "run" / "final"
    data.mkdir()
    (data / "manifest.json").write_text("{}")
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    def cfg(*extra):
        return load_config(RLRunConfig, "kimi_vl/configs/tiny_rl.yaml", [f"data.path={data}", "data.source=vision",
                                                                          *extra])

    with pytest.raises(FileNotFoundError, match=r"data.tokenizer='.*data/tokenizer' is not a folder"):
        check_inputs(cfg("init_from="))
    with pytest.raises(FileNotFoundError, match=r"data/tokenizer"):  # the export has no tokenizer either
        check_inputs(cfg(f"init_from={export.parent}"))
    (export / "tokenizer.json").write_text("{}")
    check_inputs(cfg(f"init_from={export.parent}"))
