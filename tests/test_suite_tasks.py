"""The embedded task suite: determinism, disjoint splits, strict vs final-only verifiers, token budgets."""
import pytest
import torch

from orl.recipes import get_recipe
from orl.recipes.suite import FAMILIES, task_of
from orl.tasks.base import Problem, check_problems, check_task
from orl.tasks.registry import get_task
from orl.tasks.suite import CarryTask, ChainTask, StringTask, WordChainTask, held_out, make_task

NAMES = sorted(FAMILIES)
TASKS = sorted({task_of(f) for f in FAMILIES})   # arith32 is arith's problems at another block size


def _replace_line(sol: str, i: int, new: str) -> str:
    lines = sol.split(";")
    lines[i] = new
    return ";".join(lines)


@pytest.mark.parametrize("name", TASKS)
def test_registry_deterministic_and_disjoint(name):
    task = check_task(get_task(name, **FAMILIES[name][0]))
    assert task.name == name
    again = get_task(name, **FAMILIES[name][0])
    train = [task.sample("train", i) for i in range(3000)]
    assert [p.prompt for p in train[:50]] == [again.sample("train", i).prompt for i in range(50)]
    other = get_task(name, **FAMILIES[name][0], seed=1)
    assert [p.prompt for p in train[:50]] != [other.sample("train", i).prompt for i in range(50)]
    test = check_problems(task.problems("test"), f"{name}.problems('test')")
    assert len(test) == 500 and len({p.prompt for p in test}) == 500
    assert [p.prompt for p in test] == [p.prompt for p in again.problems("test")]
    if name != "arith":  # arith buckets its operand tuples with a hash of its own
        assert all(held_out(p.prompt) for p in test) and not any(held_out(p.prompt) for p in train)
    assert not {p.prompt for p in test} & {p.prompt for p in train}


@pytest.mark.parametrize("name", TASKS)
def test_gold_passes_both_scores(name):
    task = get_task(name, **FAMILIES[name][0])
    for p in [task.sample("train", i) for i in range(300)] + task.problems("test")[:100]:
        sol = task.solution(p)
        assert task.diagnose(p, sol) == "ok", (p.prompt, sol)
        assert task.verify(p, sol) == 1.0 and task.verify_final(p, sol) == 1.0
        assert task.verify(p, " " + sol.replace(";", "; ") + "\n") == 1.0     # whitespace is not graded
        wrong = sol[:sol.index("#") + 1] + str(int(p.answer) + 1)
        assert task.verify(p, wrong) == 0.0 and task.verify_final(p, wrong) == 0.0
        assert task.verify(p, sol + ";1") == 0.0 and task.verify(p, sol.split("#")[0]) == 0.0
        assert task.verify(p, "") == 0.0 and task.diagnose(p, "no answer") == "malformed"


def test_carry_wrong_step_right_answer():
    add, mul = CarryTask(op="+"), CarryTask(op="*")
    p = Problem(id="x", prompt="4567+7898=", answer=12465, meta={"operands": [4567, 7898]})
    sol = add.solution(p)
    assert sol == "7+8+0=15;6+9+1=16;5+8+1=14;4+7+1=12;#12465"
    cases = {"sum": _replace_line(sol, 1, "6+9+1=15"), "carry": _replace_line(sol, 1, "6+9+0=16"),
             "operands": _replace_line(sol, 2, "5+7+1=14"), "steps": sol.replace("4+7+1=12;", ""),
             "malformed": _replace_line(sol, 0, "7+8+0")}
    for fault, text in cases.items():
        assert add.diagnose(p, text) == fault, (fault, text)
        assert add.verify(p, text) == 0.0 and add.verify_final(p, text) == 1.0
    q = Problem(id="y", prompt="567*8=", answer=4536, meta={"operands": [567, 8]})
    sol = mul.solution(q)
    assert sol == "7*8=56+0=56;6*8=48+5=53;5*8=40+5=45;#4536"
    cases = {"carry": _replace_line(sol, 2, "5*8=40+4=44"),   # carry not from the step before
             "product": _replace_line(sol, 1, "6*8=49+5=54"), "sum": _replace_line(sol, 1, "6*8=48+5=54"),
             "operands": _replace_line(sol, 0, "7*9=56+0=56"), "malformed": _replace_line(sol, 0, "7*8+0=56")}
    for fault, text in cases.items():
        assert mul.diagnose(q, text) == fault, (fault, text)
        assert mul.verify(q, text) == 0.0 and mul.verify_final(q, text) == 1.0
    three = CarryTask(terms=3, digits=2)
    r = three.sample("train", 5)
    assert three.verify(r, three.solution(r)) == 1.0 and three.solution(r).count("+") == 3 * 2


def test_chain_wrong_step_right_answer():
    t = ChainTask()
    p = Problem(id="x", prompt="26;+9;*2;+2;/2;/3=", answer=12,
                meta={"start": 26, "ops": [["+", 9], ["*", 2], ["+", 2], ["/", 2], ["/", 3]]})
    sol = t.solution(p)
    assert sol == "26+9=35;35*2=70;70+2=72;72/2=36;36/3=12;#12"
    cases = {"value": _replace_line(sol, 1, "35*2=71"),        # wrong result, the next line as gold
             "chain": _replace_line(sol, 2, "71+1=72"),        # does not start from the written 70
             "operation": _replace_line(sol, 2, "70*1=72"), "steps": sol.replace("72/2=36;", ""),
             "malformed": _replace_line(sol, 0, "26+9")}
    for fault, text in cases.items():
        assert t.diagnose(p, text) == fault, (fault, text)
        assert t.verify(p, text) == 0.0 and t.verify_final(p, text) == 1.0
    apply = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__, "/": int.__floordiv__}
    for p in [t.sample("train", i) for i in range(500)]:
        vals = [p.meta["start"]]
        for op, k in p.meta["ops"]:
            assert 1 <= k <= 9 and (op != "/" or vals[-1] % k == 0)
            vals.append(apply[op](vals[-1], k))
        assert all(0 <= x <= t.max_value for x in vals) and vals[-1] == p.answer
    assert {op for p in [t.sample("train", i) for i in range(200)] for op, _ in p.meta["ops"]} == set("+-*/")


def test_string_wrong_state_right_answer():
    t = StringTask()
    assert all(sorted(row) == list(range(10)) for row in t.table)            # each input digit: a permutation
    p = t.sample("train", 0)
    sol = t.solution(p)
    line = sol.split(";")[3]
    bad_state = _replace_line(sol, 3, line[0] + str((int(line[1]) + 1) % 10))
    bad_copy = _replace_line(sol, 3, str((int(line[0]) + 1) % 10) + line[1])
    assert t.diagnose(p, bad_state) == "state" and t.diagnose(p, bad_copy) == "copy"
    for text in (bad_state, bad_copy):
        assert t.verify(p, text) == 0.0 and t.verify_final(p, text) == 1.0
    s = StringTask(rule="sum")
    q = s.sample("train", 1)
    ys = [int(x[1]) for x in s.solution(q).split(";")[:-1]]
    assert ys == [sum(map(int, q.meta["input"][:i + 1])) % 10 for i in range(s.length)]


@pytest.mark.parametrize("name", NAMES)
def test_within_token_budget_and_recipes(name):
    from orl.eval.heldout import encode_prompt
    from orl.model import get_config
    from orl.tokenizer import load_tokenizer
    from orl.train.sft import task_pairs
    tok = load_tokenizer("char")
    sft, orl = get_recipe(f"suite_sft_{name}"), get_recipe(f"orl_suite_{name}", init="x", out="y")
    assert (sft.task, orl.task) == (task_of(name),) * 2 and sft.task_kwargs == orl.task_kwargs == FAMILIES[name][0]
    task = get_task(sft.task, **sft.task_kwargs)
    K, budget = FAMILIES[name].block_size, orl.eval_decode.max_new_tokens
    assert (orl.decode.block_size, orl.eval_decode.block_size) == (K, K)
    assert {s.block_size or get_config(sft.family, sft.size).block_size for s in sft.stages} == {K}
    assert budget % K == 0 and orl.decode.max_new_tokens == budget
    for p in [task.sample("train", i) for i in range(400)] + task.problems("test"):
        ids = tok.encode(task.solution(p), add_special_tokens=False)
        prompt = encode_prompt(tok, p.prompt)
        assert tok.unk_token_id not in ids + prompt
        assert 20 <= len(ids) and len(ids) + 1 <= budget and len(prompt) <= 32
    pairs = task_pairs(task, tok, 0, 4, K, chat=False)              # what SFT trains on
    assert all(len(r) % K == 0 and r[-1] == tok.eos_token_id for _, r in pairs)


def test_eval_scores_with_the_strict_verifier():
    """Evaluation and rewards call `verify`: the record's score is the strict one, on a tiny random model."""
    from orl.decode import DecodeConfig
    from orl.eval.heldout import evaluate
    from orl.model import build_model, get_config
    from orl.tokenizer import load_tokenizer
    tok = load_tokenizer("char")
    model = build_model(get_config("sdar", "tiny", vocab_size=len(tok), mask_token_id=tok.mask_token_id), seed=0)
    task = StringTask(length=4)
    ps = task.problems("test")[:4]
    with torch.no_grad():
        r = evaluate(model.eval(), tok, task, ps, DecodeConfig(block_size=8, max_new_tokens=16))
    by_id = {p.id: p for p in ps}
    assert len(r["records"]) == 4
    assert all(x["correct"] == task.verify(by_id[x["id"]], x["completion"]) for x in r["records"])


def test_wordchain_phrasings_and_faults():
    """Every phrasing the SFT data draws passes; each fault is named; the work is checked, not the wording."""
    t = WordChainTask(steps=3)
    p = Problem(id="x", prompt="26;+9;*2;-5=", answer=65, meta={"start": 26, "ops": [["+", 9], ["*", 2], ["-", 5]]})
    ok = ["26+9=35, then 2 times 35 is 70. Next, take 5 from 70: 65; the answer is #65",
          "9+26=35;35*2=70;70-5=65;#65",                                     # operands swapped where + and * allow
          "add 9 to 26 gives 35, so multiply 35 by 2 gives 70, so 70 minus 5 makes 65. #65"]
    for text in ok:
        assert t.diagnose(p, text) == "ok" and t.verify(p, text) == 1.0, text
    bad = {"operation": "26+9=35;35*2=70;5-70=65;#65",                      # - does not commute
           "value": "26+9=35;35*2=71;71-5=66;#66", "chain": "26+9=35;36*2=72;72-5=67;#67",
           "final": "26+9=35;35*2=70;70-5=65;#64", "steps": "26+9=35;35*2=70;#70",
           "malformed": "add 9 from 26: 35;35*2=70;70-5=65;#65"}          # the wrong preposition is no phrasing
    for fault, text in bad.items():
        assert t.diagnose(p, text) == fault and t.verify(p, text) == 0.0, (fault, text)
    assert t.verify_final(p, bad["operation"]) == 1.0      # right answer, wrong work: the strict score says 0
    # the data mixes the forms: over 200 problems every form and separator appears, none dominates
    task = WordChainTask()
    sols = [task.solution(task.sample("train", i)) for i in range(200)]
    for marker in (" plus ", " minus ", " times ", " over ", "add ", "take ", "multiply ", "divide ",
                   ", then ", ". Next, ", ", so ", "the answer is "):
        assert 0.05 < sum(marker in x for x in sols) / len(sols) < 0.99, marker
    one = WordChainTask(phrasing="one")
    q = one.sample("train", 3)
    assert one.solution(q) == ChainTask(steps=8, max_value=50).solution(q)     # the control: chain's one form


def test_chain_ops_knob():
    add = ChainTask(steps=3, max_value=50, ops="+")
    ps = [add.sample("train", i) for i in range(300)]
    assert all(op == "+" for p in ps for op, _ in p.meta["ops"]) and max(p.answer for p in ps) <= 50
    assert [ChainTask().sample("train", i).prompt for i in range(20)] == \
        [ChainTask(ops="+-*/").sample("train", i).prompt for i in range(20)]
    with pytest.raises(ValueError, match="ops"):
        ChainTask(ops="+^")
    with pytest.raises(ValueError, match="max_value"):
        ChainTask(steps=9, max_value=50, ops="+")


def test_bad_arguments():
    with pytest.raises(ValueError, match="op"):
        CarryTask(op="-")
    with pytest.raises(ValueError, match="steps"):
        ChainTask(steps=0)
    with pytest.raises(ValueError, match="rule"):
        StringTask(rule="xor")
    with pytest.raises(ValueError, match="n_test"):
        CarryTask(op="*", digits=1).problems("test")
    with pytest.raises(ValueError, match="splits"):
        ChainTask().problems("dev")
    with pytest.raises(ValueError, match="family"):
        make_task("nope")
