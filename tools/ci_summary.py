#!/usr/bin/env python3
"""Counts test results for CI: one line `N passed, N failed, N skipped`.

    tools/ci_summary.py [BUILD_DIR ...]      (default: build)

Each build dir is one run of the suite (build-san, and build for a plain run too); the line
counts them all, and results of a run other than the first are labelled with its dir.

Boost.Test binaries write JUnit reports (build/tests/junit/<name>.xml): their test cases are
counted one by one. A binary that produced no report (crashed, timed out, exit 77) is counted
from meson's testlog.json as one result. A skip is never silent: each is listed with its
reason, and a skip in the security suite counts as a failure (a security probe that cannot run
on the reference machine proves nothing).
"""
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

builds = sys.argv[1:] or ["build"]

passed = failed = skipped = 0
notes = []

def record_skip(label, reason, security):
    """A skip is never silent; in the security suite it is a failure."""
    global failed, skipped
    if security:
        failed += 1
        notes.append(f"FAILED  {label}: a security test skipped ({reason})")
    else:
        skipped += 1
        notes.append(f"SKIPPED {label}: {reason}")


def read_report(path):
    """A JUnit report's root. Boost.Test writes the values of a check as they are, and a test
    that compares binary output logs control characters XML 1.0 does not allow: they are
    dropped (and bytes that are not UTF-8 replaced) so its cases still count one by one."""
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", errors="replace")
    text = re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", "", text)
    return ET.fromstring(text)


def details(case, limit=3, width=700):
    """What a failed case reported (its first `limit` failures, each cut to `width` chars),
    indented under its FAILED line: CI keeps only the end of the output, where this is."""
    out = []
    for f in [*case.iter("failure"), *case.iter("error")][:limit]:
        text = " ".join(((f.text or "") + " " + (f.get("message") or "")).split())
        out.append("\n        " + (text[:width] + " ..." if len(text) > width else text))
    return "".join(out)


def count(build, prefix):
    """Adds one build dir's run to the totals."""
    global passed, failed
    log = os.path.join(build, "meson-logs", "testlog.json")
    junit_dir = os.path.join(build, "tests", "junit")
    if not os.path.exists(log):
        failed += 1
        notes.append(f"FAILED  {build}: no meson test log found: the suite did not run")
        return
    runs = []
    with open(log) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                runs.append(json.loads(line))
            except json.JSONDecodeError:
                # A torn log (another meson run wrote it meanwhile) still ends in the count line.
                failed += 1
                notes.append(f"FAILED  {build}: line {n} of testlog.json is not JSON")

    for run in runs:
        name = run["name"].split(" / ")[-1]
        label = prefix + name
        suites = run.get("suite", [])
        security = any(s.endswith("security") for s in suites)
        result = run["result"]
        report = os.path.join(junit_dir, name + ".xml")
        cases = None
        if result in ("OK", "FAIL", "EXPECTEDFAIL", "UNEXPECTEDPASS") and os.path.exists(report) \
                and os.path.getmtime(report) >= os.path.getmtime(log) - run.get("duration", 0) - 3600:
            try:
                cases = list(read_report(report).iter("testcase"))
            except ET.ParseError:
                cases = None
        if cases:
            for c in cases:
                cname = f"{label}/{c.get('name')}"
                if c.find("failure") is not None or c.find("error") is not None:
                    failed += 1
                    notes.append(f"FAILED  {cname}" + details(c))
                elif c.find("skipped") is not None:
                    record_skip(cname, (c.find("skipped").get("message") or "").strip(), security)
                else:
                    passed += 1
            if result == "FAIL" and not any(n.startswith(f"FAILED  {label}/") for n in notes):
                failed += 1
                notes.append(f"FAILED  {label}: exited {run.get('returncode')} (see testlog.txt)")
            continue
        if result == "OK":
            passed += 1
        elif result == "SKIP":
            reason = (run.get("stdout") or "").strip().splitlines()[-1:] or ["no reason printed"]
            record_skip(label, reason[0], security)
        else:
            failed += 1
            notes.append(f"FAILED  {label}: {result} (exit {run.get('returncode')})")


for i, b in enumerate(builds):
    count(b, "" if i == 0 else os.path.basename(os.path.normpath(b)) + ":")

for n in notes:
    print(n)
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
