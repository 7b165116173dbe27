"""``--set`` overrides and config limits are checked up front, with the field's name, the type it
expects and the range it allows; `orl eval`'s prepared sets follow ``--limit``; the main table
counts the prompts that do not fit the context instead of stopping at the first one."""
import json

import pytest

from orl.recipes import apply_overrides, get_recipe, list_recipes

BAD = [  # (recipe, --set, the error's words)
    ("arith_sft_smoke", "batch_size=abc", "batch_size expects an int, got 'abc'"),
    ("arith_sft_smoke", "batch_size=0", "batch_size must be >= 1 (got 0)"),
    ("arith_sft_smoke", "save_every=0", "save_every must be >= 1 (got 0)"),
    ("orl_arith_smoke", "save_every=0", "save_every must be >= 1 (got 0)"),
    ("orl_arith_smoke", "group_size=0", "group_size must be >= 1 (got 0)"),
    ("orl_arith_smoke", "loss.gate=bogus", "loss.gate must be one of 'hard', 'soft', 'none' (got 'bogus')"),
    ("arith_sft_smoke", "stages.0.steps=2.5", "stages.0.steps expects an int, got '2.5'"),
    ("arith_sft_smoke", "stages.1.selfcond=1.5", "stages.1.selfcond must be in [0, 1] (got 1.5)"),
    ("arith_sft_smoke", "stages.9.steps=3", "index 9 is out of range (the list has 2 items"),
    ("orl_arith_smoke", "task_kwargs.shuffle=none", "task_kwargs.shuffle expects a float, got 'none'"),
    ("orl_arith_smoke", "task_kwargs.shufle=0.5", "task 'arith' takes no option 'shufle'; it takes:"),
    ("arith_sft_smoke", "model.num_layer=3", "ModelConfig takes no option 'num_layer'"),
    ("orl_arith_smoke", "lr=0", "lr must be > 0 (got 0.0)"),
    ("orl_arith_smoke", "lr=fast", "lr expects a float, got 'fast'"),
    ("orl_arith_smoke", "decode.block_size=0", "block_size must be >= 1"),
    ("orl_arith_smoke", "decode.residual=maybe", "decode.residual expects a bool (true or false), got 'maybe'"),
    ("orl_arith_smoke", "decode.rule=fast", "decode.rule must be one of"),
    ("orl_arith_smoke", "eval_decode.threshold=2", "eval_decode.threshold must be in [0, 1] (got 2.0)"),
    ("orl_arith_smoke", "loss=hard", "loss is a LossConfig; set its fields one by one"),
    ("orl_arith_smoke", "task=chain", "task 'chain' takes no option 'terms'"),
]


@pytest.mark.parametrize("recipe,item,words", BAD, ids=[b[1] for b in BAD])
def test_bad_override_names_field_type_and_range(recipe, item, words):
    with pytest.raises(ValueError) as e:
        apply_overrides(get_recipe(recipe), [item])
    assert words in str(e.value)


def test_good_overrides_parse_by_the_fields_type():
    sft = apply_overrides(get_recipe("arith_sft_smoke"), ["stages.0.steps=7", "stages.0.lr=1", "batch_size=4",
                                                          "stages.1.block_size=none", "model.num_layers=3",
                                                          "task_kwargs.shuffle=1", "chat=true", "threads=none"])
    assert sft.stages[0].steps == 7 and type(sft.stages[0].lr) is float and sft.stages[1].block_size is None
    assert sft.batch_size == 4 and sft.model == {"num_layers": 3} and sft.chat is True and sft.threads is None
    assert type(sft.task_kwargs["shuffle"]) is float   # a float option: 1 is 1.0, not the int
    orl = apply_overrides(get_recipe("orl_arith_smoke"), ["loss.anchor=none", "decode.steps=none", "eval_decode=none",
                                                          "decode.threshold=1", "lr=1e-4", "decode.residual=false",
                                                          "task_kwargs.seed=3", "out='runs/x y'"])
    assert orl.loss.anchor == "none"   # "none" is a str field's word, None only where the field is Optional
    assert orl.decode.steps is None and orl.eval_decode is None
    assert type(orl.decode.threshold) is float and orl.lr == 1e-4 and orl.decode.residual is False
    assert orl.task_kwargs["seed"] == 3 and orl.out == "runs/x y"


def test_every_recipe_validates_and_every_problem_is_listed():
    from orl.recipes.validate import validate
    for fn in list_recipes().values():
        validate(fn())
    cfg = get_recipe("arith_sft_smoke")
    cfg.batch_size, cfg.stages[1].warmup, cfg.weighting = 0, -1, "square"
    with pytest.raises(ValueError) as e:
        validate(cfg)
    msg = str(e.value)
    assert "3 problems" in msg and "batch_size must be >= 1 (got 0)" in msg
    assert "stages.1.warmup must be >= 0 (got -1)" in msg and "weighting must be one of 'elbo', 'flat'" in msg


def test_cli_refuses_before_any_work(tmp_path, capsys):
    """`orl sft --set save_every=0` fails at once (it used to divide by zero after a trained step)."""
    from orl.cli import main
    out = tmp_path / "run"
    assert main(["sft", "--recipe", "arith_sft_smoke", "--out", str(out), "--set", "save_every=0", "--quiet"]) == 1
    assert "save_every must be >= 1 (got 0)" in capsys.readouterr().err
    assert not out.exists()   # no model built, no step taken, nothing written


# --------------------------------------------------------------------------- orl eval
@pytest.fixture(scope="module")
def llm():
    from orl import LLM
    return LLM("sdar/tiny")


def test_limit_change_prepares_again(llm, tmp_path):
    from orl.eval.cli import run_task
    first = run_task(llm, "arith", tmp_path, 3, 8)
    again = run_task(llm, "arith", tmp_path, 5, 8)
    assert first["n"] == 3 and again["n"] == 5 and again["n_expected"] == 5
    manifest = json.loads((tmp_path / "inputs" / "arith" / "manifest.json").read_text())
    assert manifest["limit"] == 5 and manifest["n"] == 5
    aside = sorted(p.name for p in tmp_path.glob("arith.*.*.jsonl"))
    assert len(aside) == 2   # the limit-3 generations and scores, kept under their manifest's hash
    assert run_task(llm, "arith", tmp_path, 5, 8)["n"] == 5   # same limit: reused, nothing set aside
    assert sorted(p.name for p in tmp_path.glob("arith.*.*.jsonl")) == aside


def test_main_table_skips_and_counts_prompts_over_the_context(llm, tmp_path):
    """GSM8K's first six prompts are 176-542 characters; the tiny model's context is 512 tokens of
    one character each: the 542-character one cannot fit, the table still comes out, counting it."""
    from orl.eval.cli import run_task
    from orl.eval.prepare import load_prepared, prepare
    from orl.eval.table import main_table
    lengths = [llm.count_tokens(r["prompt"]) for r in load_prepared(prepare("gsm8k", tmp_path / "p", 6)).rows]
    too_long = sum(n + 16 > llm.context_length for n in lengths)
    assert too_long >= 1 and too_long < 6
    result = run_task(llm, "gsm8k", tmp_path / "out", 6, 16)
    assert result["n"] == 6 - too_long and result["n_skipped"] == too_long and len(result["skipped"]) == too_long
    md, js = main_table({"gsm8k": result}, "sdar", "base")
    assert f"| {6 - too_long} ({too_long} skipped) |" in md and f"{too_long} of 6 prompts skipped" in md
    assert js["tasks"]["gsm8k"]["ours"]["n_skipped"] == too_long and js["n_skipped"] == too_long


def test_serve_and_eval_decoding_sets_are_typed():
    """`orl serve` / `orl eval` --set: DecodeConfig's fields parse by type; other LLM keywords pass."""
    from orl.decode import DecodeConfig
    from orl.recipes import parse_sets
    assert parse_sets(["threshold=1", "use_cache=false", "rng=counter"], DecodeConfig) == \
        {"threshold": 1.0, "use_cache": False, "rng": "counter"}
    with pytest.raises(ValueError, match="threshold expects a float, got 'abc'"):
        parse_sets(["threshold=abc"], DecodeConfig)


def test_generate_refuses_a_limit_the_prepared_folder_cannot_meet(tmp_path):
    from orl.eval.cli import cli
    from orl.eval.prepare import prepare
    prepare("arith", tmp_path / "p", limit=3)
    with pytest.raises(ValueError, match="--limit 5 asks for more prompts than .* holds \\(3, prepared with --limit 3\\)"):
        cli(["generate", "--model", "sdar/tiny", "--prepared", str(tmp_path / "p"), "--out", str(tmp_path / "g.jsonl"),
             "--limit", "5"])
    assert not (tmp_path / "g.jsonl").exists()


@pytest.mark.parametrize("item,words", [("threshold=abc", "threshold expects a float, got 'abc'"),
                                        ("threshold=5", "threshold must be in [0, 1] (got 5.0)")])
def test_generate_sets_are_typed_and_checked(item, words, capsys):
    """`orl generate --set` parses against DecodeConfig's types and checks its ranges, as `orl serve`."""
    from orl.cli import main
    assert main(["generate", "--model", "sdar/tiny", "hi", "--set", item, "--no-warmup"]) != 0
    assert words in capsys.readouterr().err
