"""IFEval's 25 verifiable instructions: one pure check each, and the strict / loose verdicts.

IFEval (Zhou et al., 2023, "Instruction-Following Evaluation for Large Language Models",
arXiv:2311.07911) attaches to each prompt a list of instruction ids (``punctuation:no_comma``,
``length_constraints:number_words``, ...) and one kwargs dict per id. `CHECKS` maps every id the
public ``input_data.jsonl`` uses to ``(check, required kwargs)``; a check takes the response and the
kwargs and says whether the response follows the instruction. The checks are written here from the
paper's definitions and the behaviour of its reference implementation (Apache-2.0), not copied;
where ours differs, the function says so. `follows` gives the paper's two verdicts per instruction:

* strict: the check on the response as it is (an empty response follows nothing);
* loose: the check passes on any of eight variants of the response -- itself, without its first
  line, without its last line, without both, and those four with every ``*`` removed (the
  paper's transformations for markdown emphasis and intro / outro lines).

Deliberate differences from the reference implementation, all forced or for determinism:

* sentences (``length_constraints:number_sentences``): the reference uses NLTK's Punkt English
  model, a pickle that must be downloaded; `split_sentences` is a rule-based stand-in (a break
  after ``.``/``!``/``?`` and closing quotes followed by white space, not after common
  abbreviations, initials or list numbers), equal on ordinary prose, not on every edge case;
* words for ``change_case:capital_word_frequency``: the reference uses NLTK's ``word_tokenize``;
  `word_tokens` keeps hyphenated words whole and splits English contractions (``DON'T`` -> ``DO``,
  ``N'T``) as it does, but is a regular expression, not the Treebank tokenizer;
* ``keywords:letter_frequency`` counts the character the data names (the data also asks for
  ``#`` and ``!``); the reference replaces a non-letter by a random letter;
* language (``language:response_language``, ``change_case:english_capital``/``_lowercase``) is
  langdetect's, as in the reference, but from a private detector seeded with 0: the reference's
  module-level ``langdetect.detect`` is unseeded, so its verdict on short text can change between
  runs. As in the reference, text whose language cannot be detected passes the language part.
  langdetect (Apache-2.0) is imported only by these three checks: ``pip install langdetect``;
* keywords, section splitters and postscript markers are matched literally (``re.escape``); the
  reference passes them to ``re`` as patterns, which is the same for the data's plain words.

Words (``length_constraints:number_words``) are runs of ``\\w`` characters, as the reference's
``RegexpTokenizer(r"\\w+")``: identical counts.

Does not own: the data file, prompts and the task object (`orl.tasks.ifeval`).
"""
from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any

RELATIONS = ("less than", "at least")
CONSTRAINED_RESPONSES = ("My answer is yes.", "My answer is no.", "My answer is maybe.")

_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs etc inc ltd co corp no fig figs approx dept est vol ed eds al "
    "gen gov sen rep mt ft rev jan feb mar apr jun jul aug sep sept oct nov dec".split())
_BOUNDARY = re.compile(r"([.!?]+)([\"'”’)\]]*)(?=\s|$)")
_WORD = re.compile(r"\w+")
_TOKEN = re.compile(r"\w+(?:[-'’.&]\w+)*")
_CONTRACTION = re.compile(r"(?i)^(\w+?)(n['’]t|['’](?:s|re|ve|ll|d|m))$")


def _compare(value: int, relation: str, threshold: int) -> bool:
    if relation == "less than":
        return value < threshold
    if relation == "at least":
        return value >= threshold
    raise ValueError(f"relation must be one of {RELATIONS}, not {relation!r}")


# -- text measures -------------------------------------------------------------------------------

def count_words(text: str) -> int:
    """Words as runs of ``\\w`` characters (the reference's count exactly)."""
    return len(_WORD.findall(text))


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` (see the module docstring: a stand-in for NLTK's Punkt)."""
    out, start = [], 0
    for m in _BOUNDARY.finditer(text):
        before = text[start:m.start()]
        last = re.search(r"(\S+)$", before)
        word = last.group(1).lower().lstrip("\"'(“‘[") if last else ""
        if m.group(1) == ".":
            if (word in _ABBREVIATIONS or re.fullmatch(r"[a-z]", word)
                    or re.fullmatch(r"(?:[a-z]\.)+[a-z]", word)):
                continue  # "Dr.", "J.", "e.g.", "U.S."
            if word.isdigit() and re.search(r"(?:^|\n)[ \t]*\S+$", before):
                continue  # "1. " opening a numbered line
        elif m.group(1).startswith("..") and not re.match(r"\s*[A-Z\"“]", text[m.end():]):
            continue  # an ellipsis inside a sentence
        piece = text[start:m.end()].strip()
        if piece:
            out.append(piece)
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out


def count_sentences(text: str) -> int:
    return len(split_sentences(text))


def word_tokens(text: str) -> list[str]:
    """Word tokens for counting capitalised words (see the module docstring)."""
    out = []
    for tok in _TOKEN.findall(text):
        m = _CONTRACTION.match(tok)
        out.extend(m.groups() if m else (tok,))
    return out


@functools.lru_cache(maxsize=1)
def _language_factory():
    try:
        from langdetect.detector_factory import PROFILES_DIRECTORY, DetectorFactory
    except ImportError:
        raise ImportError(
            "IFEval's language checks (language:response_language, change_case:english_capital, "
            "change_case:english_lowercase) use langdetect, as IFEval's reference implementation "
            "does; install it: pip install langdetect==1.0.9") from None
    factory = DetectorFactory()
    factory.load_profile(PROFILES_DIRECTORY)
    factory.set_seed(0)  # a private, seeded detector: the same verdict every run
    return factory


def detect_language(text: str) -> str | None:
    """langdetect's ISO 639-1 code for ``text`` (``zh-cn``/``zh-tw`` for Chinese), None when it
    finds no language (no letters)."""
    from langdetect.lang_detect_exception import LangDetectException

    detector = _language_factory().create()
    detector.append(text)
    try:
        return detector.detect()
    except LangDetectException:
        return None


def _is_language(text: str, code: str) -> bool:
    found = detect_language(text)
    return found is None or found == code  # undetectable passes, as in the reference


# -- the 25 checks (r: the response, k: the instruction's kwargs) ----------------------------------

def _existence(r: str, k: dict) -> bool:
    return all(re.search(re.escape(w), r, re.IGNORECASE) for w in k["keywords"])


def _frequency(r: str, k: dict) -> bool:
    n = len(re.findall(re.escape(str(k["keyword"]).strip()), r, re.IGNORECASE))
    return _compare(n, k["relation"], int(k["frequency"]))


def _forbidden(r: str, k: dict) -> bool:
    return not any(re.search(rf"\b{re.escape(w)}\b", r, re.IGNORECASE) for w in k["forbidden_words"])


def _letter_frequency(r: str, k: dict) -> bool:
    return _compare(r.lower().count(str(k["letter"]).strip().lower()), k["let_relation"],
                    int(k["let_frequency"]))


def _response_language(r: str, k: dict) -> bool:
    return _is_language(r, k["language"])


def _number_sentences(r: str, k: dict) -> bool:
    return _compare(count_sentences(r), k["relation"], int(k["num_sentences"]))


def _number_paragraphs(r: str, k: dict) -> bool:
    """Paragraphs separated by the markdown divider ``***``; an empty one inside fails."""
    parts = re.split(r"\s?\*\*\*\s?", r)
    n = len(parts)
    for i, part in enumerate(parts):
        if not part.strip():
            if i in (0, len(parts) - 1):
                n -= 1
            else:
                return False
    return n == int(k["num_paragraphs"])


def _number_words(r: str, k: dict) -> bool:
    return _compare(count_words(r), k["relation"], int(k["num_words"]))


def _nth_paragraph_first_word(r: str, k: dict) -> bool:
    """Exactly ``num_paragraphs`` paragraphs (split by a blank line) and paragraph ``nth_paragraph``
    (1-based) starts with ``first_word`` (case-insensitive, leading quotes and trailing
    punctuation ignored)."""
    parts = r.split("\n\n")
    n = sum(1 for p in parts if p.strip())
    nth = int(k["nth_paragraph"])
    if not 1 <= nth <= n:
        return False
    paragraph = parts[nth - 1].strip()
    if not paragraph:
        return False
    word = paragraph.split()[0].strip().lstrip("'").lstrip('"')
    first = re.match(r"[^.,?!'\"]*", word).group(0).lower()
    return n == int(k["num_paragraphs"]) and first == str(k["first_word"]).strip().lower()


def _number_placeholders(r: str, k: dict) -> bool:
    return len(re.findall(r"\[.*?\]", r)) >= int(k["num_placeholders"])


def _postscript(r: str, k: dict) -> bool:
    marker = str(k["postscript_marker"]).strip()
    if marker == "P.P.S":
        pattern = r"\s*p\.\s?p\.\s?s.*$"
    elif marker == "P.S.":
        pattern = r"\s*p\.\s?s\..*$"
    else:
        pattern = r"\s*" + re.escape(marker.lower()) + r".*$"
    return re.search(pattern, r.lower(), re.MULTILINE) is not None


def _number_bullet_lists(r: str, k: dict) -> bool:
    """Exactly ``num_bullets`` lines starting with ``* `` or ``-`` (markdown bullets)."""
    n = len(re.findall(r"^\s*\*[^*].*$", r, re.MULTILINE)) + len(re.findall(r"^\s*-.*$", r, re.MULTILINE))
    return n == int(k["num_bullets"])


def _constrained_response(r: str, k: dict) -> bool:
    return any(option in r.strip() for option in CONSTRAINED_RESPONSES)


def _number_highlighted_sections(r: str, k: dict) -> bool:
    """At least ``num_highlights`` non-empty ``*...*`` spans (a ``**...**`` span also counts once more)."""
    n = sum(1 for h in re.findall(r"\*[^\n*]*\*", r) if h.strip("*").strip())
    n += sum(1 for h in re.findall(r"\*\*[^\n*]*\*\*", r) if h[2:-2].strip())
    return n >= int(k["num_highlights"])


def _multiple_sections(r: str, k: dict) -> bool:
    """At least ``num_sections`` sections, each opened by the splitter word and a number ("SECTION 1")."""
    splitter = re.escape(str(k["section_spliter"]).strip())
    return len(re.split(rf"\s?{splitter}\s?\d+\s?", r)) - 1 >= int(k["num_sections"])


def _json_format(r: str, k: dict) -> bool:
    text = r.strip()
    for fence in ("```json", "```Json", "```JSON", "```"):  # in turn, as the reference strips them
        text = text.removeprefix(fence)
    text = text.removesuffix("```").strip()
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _title(r: str, k: dict) -> bool:
    return any(t.lstrip("<").rstrip(">").strip() for t in re.findall(r"<<[^\n]+>>", r))


def _two_responses(r: str, k: dict) -> bool:
    """Exactly two different non-empty responses separated by ``******``."""
    parts = r.split("******")
    valid = []
    for i, part in enumerate(parts):
        if part.strip():
            valid.append(part)
        elif i not in (0, len(parts) - 1):
            return False
    return len(valid) == 2 and valid[0].strip() != valid[1].strip()


def _repeat_prompt(r: str, k: dict) -> bool:
    return r.strip().lower().startswith(str(k["prompt_to_repeat"]).strip().lower())


def _end_checker(r: str, k: dict) -> bool:
    return r.strip().strip('"').lower().endswith(str(k["end_phrase"]).strip().lower())


def _capital_word_frequency(r: str, k: dict) -> bool:
    n = sum(1 for w in word_tokens(r) if w.isupper())
    return _compare(n, k["capital_relation"], int(k["capital_frequency"]))


def _english_capital(r: str, k: dict) -> bool:
    return r.isupper() and _is_language(r, "en")


def _english_lowercase(r: str, k: dict) -> bool:
    return r.islower() and _is_language(r, "en")


def _no_comma(r: str, k: dict) -> bool:
    return "," not in r


def _quotation(r: str, k: dict) -> bool:
    text = r.strip()
    return len(text) > 1 and text[0] == '"' and text[-1] == '"'


CHECKS: dict[str, tuple[Callable[[str, dict], bool], tuple[str, ...]]] = {
    "keywords:existence": (_existence, ("keywords",)),
    "keywords:frequency": (_frequency, ("keyword", "frequency", "relation")),
    "keywords:forbidden_words": (_forbidden, ("forbidden_words",)),
    "keywords:letter_frequency": (_letter_frequency, ("letter", "let_frequency", "let_relation")),
    "language:response_language": (_response_language, ("language",)),
    "length_constraints:number_sentences": (_number_sentences, ("num_sentences", "relation")),
    "length_constraints:number_paragraphs": (_number_paragraphs, ("num_paragraphs",)),
    "length_constraints:number_words": (_number_words, ("num_words", "relation")),
    "length_constraints:nth_paragraph_first_word": (
        _nth_paragraph_first_word, ("num_paragraphs", "nth_paragraph", "first_word")),
    "detectable_content:number_placeholders": (_number_placeholders, ("num_placeholders",)),
    "detectable_content:postscript": (_postscript, ("postscript_marker",)),
    "detectable_format:number_bullet_lists": (_number_bullet_lists, ("num_bullets",)),
    "detectable_format:constrained_response": (_constrained_response, ()),
    "detectable_format:number_highlighted_sections": (_number_highlighted_sections, ("num_highlights",)),
    "detectable_format:multiple_sections": (_multiple_sections, ("section_spliter", "num_sections")),
    "detectable_format:json_format": (_json_format, ()),
    "detectable_format:title": (_title, ()),
    "combination:two_responses": (_two_responses, ()),
    "combination:repeat_prompt": (_repeat_prompt, ("prompt_to_repeat",)),
    "startend:end_checker": (_end_checker, ("end_phrase",)),
    "change_case:capital_word_frequency": (_capital_word_frequency, ("capital_frequency", "capital_relation")),
    "change_case:english_capital": (_english_capital, ()),
    "change_case:english_lowercase": (_english_lowercase, ()),
    "punctuation:no_comma": (_no_comma, ()),
    "startend:quotation": (_quotation, ()),
}
_RELATION_KEYS = ("relation", "let_relation", "capital_relation")


def clean_kwargs(instruction_id: str, kwargs: Any) -> dict:
    """``kwargs`` without unset (None) entries, after checking that ``instruction_id`` is known and
    its required arguments are there; ``ValueError`` naming what is wrong otherwise. (Exports of
    IFEval with one column per argument fill the others with None.)"""
    if instruction_id not in CHECKS:
        raise ValueError(f"unknown IFEval instruction {instruction_id!r}; known: {', '.join(sorted(CHECKS))}")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise ValueError(f"{instruction_id}: kwargs must be an object, got {type(kwargs).__name__}")
    out = {key: v for key, v in kwargs.items() if v is not None}
    missing = [key for key in CHECKS[instruction_id][1] if key not in out]
    if missing:
        raise ValueError(f"{instruction_id} needs {', '.join(missing)} (has {', '.join(sorted(out)) or 'none'})")
    for key in _RELATION_KEYS:
        if key in CHECKS[instruction_id][1] and out[key] not in RELATIONS:
            raise ValueError(f"{instruction_id}: {key} must be one of {RELATIONS}, not {out[key]!r}")
    return out


def check(instruction_id: str, response: str, kwargs: dict) -> bool:
    """Whether ``response`` follows one instruction, read as it is."""
    return bool(CHECKS[instruction_id][0](response, kwargs))


def loose_variants(response: str) -> list[str]:
    """The paper's eight readings of a response for the loose verdict (see the module docstring)."""
    lines = response.split("\n")
    first = "\n".join(lines[1:]).strip()
    last = "\n".join(lines[:-1]).strip()
    both = "\n".join(lines[1:-1]).strip()
    variants = [response, first, last, both]
    return variants + [v.replace("*", "") for v in variants]


def follows(instruction_ids: list[str], kwargs_list: list[dict], response: str) -> tuple[list[bool], list[bool]]:
    """Strict and loose verdicts, one per instruction (``kwargs_list`` cleaned by `clean_kwargs`)."""
    strict, loose = [], []
    variants = [v for v in loose_variants(response) if v.strip()]
    for iid, kw in zip(instruction_ids, kwargs_list, strict=True):
        strict.append(bool(response.strip()) and check(iid, response, kw))
        loose.append(any(check(iid, v, kw) for v in variants))
    return strict, loose
