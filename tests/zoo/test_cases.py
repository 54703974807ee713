"""Every case of the zoo is sound: its manifest has every key, its commit is pinned, its originals
are there, every hunk of its cpu.patch says why (a `zoo:` line) and the patch applies exactly."""

from __future__ import annotations

import pytest

from tests.support.zoo import runner

cases = runner("cases")
DIRS = cases.all_cases()


def test_the_zoo_has_cases():
    assert len(DIRS) >= 8, [d.name for d in DIRS]


@pytest.mark.parametrize("directory", DIRS, ids=[d.name for d in DIRS])
def test_a_case_is_sound(directory):
    assert cases.problems(directory) == []


@pytest.mark.parametrize("directory", DIRS, ids=[d.name for d in DIRS])
def test_a_patched_script_still_parses(directory):
    case = cases.load(directory)
    for name, text in case.patched().items():
        if name.endswith(".py"):
            compile(text, f"zoo/{case.name}/{name} (patched)", "exec")


def test_every_case_s_licence_is_listed():
    listed = (cases.ZOO / "LICENSES.md").read_text().splitlines()
    wanted = [line for line in cases.licenses(DIRS).splitlines() if line.startswith("- ")]
    assert [line for line in wanted if line not in listed] == []


def test_at_most_four_cases_are_in_make_tests_subset():
    fast = [d.name for d in DIRS if cases.load(d).run["fast"]]
    assert len(fast) <= 4, fast


def test_a_case_without_a_key_or_with_a_bad_commit_is_refused(tmp_path):
    case = tmp_path / "broken"
    case.mkdir()
    (case / "s.py").write_text("print(1)\n")
    (case / "case.toml").write_text(
        '[source]\nrepo = "o/n"\ncommit = "abc"\npath = "s.py"\nfiles = ["s.py"]\nlicense = "MIT"\n'
        'launch = "python s.py"\n[run]\nframework = "torch"\nargs = []\nsteps = 1\nfast = false\n'
        '[expect]\nverdict = "equivalent"\ndefects = ["nonsense"]\n'
    )
    problems = cases.problems(case)
    assert problems == ["zoo/broken/case.toml: [expect] has no key 'why'"]
    text = (
        (case / "case.toml")
        .read_text()
        .replace('defects = ["nonsense"]', 'defects = ["nonsense"]\nwhy = "x"')
    )
    (case / "case.toml").write_text(text)
    assert cases.problems(case) == [
        "zoo/broken/case.toml: [source] commit is not 40 hex digits: 'abc'",
        "zoo/broken/case.toml: [expect] defects: 'nonsense' is not a known kind",
    ]


def test_the_manifests_vocabulary_is_rankwise_s():
    """The checker keeps its own lists (it reads manifests without importing torch); they must be
    the frameworks verify detects and the causes its diagnosis ranks."""
    from rankwise.tools.verify.diagnose import CONSEQUENCE
    from rankwise.tools.watch.frameworks import FRAMEWORKS

    assert set(cases.FRAMEWORKS) == set(FRAMEWORKS) - {"auto", "rankwise"}
    assert set(CONSEQUENCE) <= set(cases.KINDS)
