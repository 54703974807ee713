"""make test's real subset of the zoo: `rankwise verify` on each case marked ``fast = true``, as
`make zoo` runs it (the patched copy, the CLI by its path, no --framework), must give the
manifest's verdict, detect the manifest's framework and name every defect it lists and no other."""

from __future__ import annotations

import pytest

from tests.support.zoo import runner

pytestmark = pytest.mark.multiproc  # each test runs rankwise verify: ranks and a reference

cases, runs, score = runner("cases"), runner("runs"), runner("score")
FAST = [d for d in cases.all_cases() if cases.load(d).run["fast"]]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("directory", FAST, ids=[d.name for d in FAST])
def test_verify_says_what_the_manifest_says(directory, tmp_path):
    case = cases.load(directory)
    verify = runs.commands(case, runs.tool("rankwise"), tmp_path)[0]
    verify.timeout = 200
    cwd = runs.workdir(case, tmp_path / "work")
    log = tmp_path / "verify.log"
    code, _ = runs.run(verify, cwd, runs.environment(runs.site_for(case, tmp_path / "site")), log)
    said = score.verify_said(verify.out)
    assert said, f"verify wrote no verify.json (exit {code}): {score.first_error(log)}"
    result = score.score("verify", code, said, case.expect, case.run["framework"])
    assert (said["verdict"], said["framework"]) == (case.expect["verdict"], case.run["framework"])
    assert (result["missed"], result["false"]) == ([], []), said
    assert result["outcome"] == "ok"
