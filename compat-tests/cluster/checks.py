"""What validate-compose.py and validate-k8s.py share: the command line and the self-test.

A validator is a function from the parsed file to a list of problems; a self-test runs it on
the file (which must pass) and on each broken variant (which must not).
"""
import copy
import sys


def selftest(doc, validate, variants):
    """Each broken variant must be rejected; the file itself must pass."""
    failures = 0
    base = validate(doc)
    if base:
        print(f"selftest: the file itself is invalid: {base}")
        failures += 1
    for name, mutate in variants.items():
        d = copy.deepcopy(doc)
        mutate(d)
        if not validate(d):
            print(f"selftest: variant '{name}' was accepted")
            failures += 1
    print("selftest " + ("PASS" if failures == 0 else f"FAIL ({failures})"))
    return failures == 0


def main(argv, usage, default_path, load, check):
    """`[path] [--selftest]`: loads the file with `load(file)` and checks it with
    `check(doc, path, self_test)`, which returns (problems, self-test passed)."""
    self_test = "--selftest" in argv
    paths = [a for a in argv if a != "--selftest"]
    if len(paths) > 1:
        print(usage, file=sys.stderr)
        return 2
    path = paths[0] if paths else default_path
    try:
        with open(path) as f:
            doc = load(f)
    except Exception as e:  # unreadable or unparsable: one problem, reported
        print(f"FAIL {path}: {e}")
        return 1
    errors, selftest_ok = check(doc, path, self_test)
    for e in errors:
        print(f"FAIL {e}")
    name = path.rsplit("/", 1)[-1]
    print(f"{name}: {'valid' if not errors else f'{len(errors)} problem(s)'}")
    return 0 if not errors and selftest_ok else 1
