"""`kiln tokens` describes a dataset; `kiln tokenize` reports user errors in one line."""

from __future__ import annotations

from kiln.platform.cli import main
from tests.training.data.helpers import write_unique_dataset


def test_tokens_describes_a_prefix_and_a_folder(tmp_path, capsys):
    write_unique_dataset(tmp_path / "train", 10, 20)
    assert main(["tokens", str(tmp_path / "train")]) == 0
    assert "10 documents" in capsys.readouterr().out
    assert main(["tokens", str(tmp_path), "--split", "train"]) == 0
    assert "dtype int32" in capsys.readouterr().out


def test_tokens_on_a_wrong_folder_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "run" / "tokens").mkdir(parents=True)
    assert main(["tokens", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"kiln: error: {tmp_path / 'run'}: no .idx files: not a TokenDataset folder "
        "(try its tokens/ folder)"
    ]
    assert main(["tokens", str(tmp_path / "nowhere")]) == 2
    assert "no such TokenDataset folder or .bin/.idx prefix" in capsys.readouterr().err


def test_tokenize_user_errors(tmp_path, capsys):
    assert main(["tokenize", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "no such Corpus directory" in capsys.readouterr().err
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("")
    assert main(["tokenize", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (
        main(
            [
                "tokenize",
                str(tmp_path),
                "--out",
                str(tmp_path / "o2"),
                "--valid-fraction",
                "0.6",
                "--test-fraction",
                "0.5",
            ]
        )
        == 2
    )
    assert "valid_fraction + test_fraction" in capsys.readouterr().err
