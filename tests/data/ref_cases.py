"""ref_cases.py - the command line the reference checkers of tests/data share: check every
case folder under ROOT with the checker's check_case, print one summary line, and with --rm
remove ROOT when all agree.

    run_cases(doc, check_case, what, tol) -> the process exit status (0 all agree, 1 not, 2 usage);
    tol None: no tolerance in the line
"""
import os
import shutil
import sys


def run_cases(doc, check_case, what, tol):
    args = sys.argv[1:]
    rm = "--rm" in args
    args = [a for a in args if a != "--rm"]
    if len(args) != 1:
        print(doc)
        return 2
    root = args[0]
    dirs = sorted(os.path.join(root, d) for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    if not dirs:
        print("no cases in", root)
        return 1
    ok = all([check_case(d) for d in dirs])
    print("%s%d configurations, %s%s" % (what, len(dirs), "all agree" if ok else "DISAGREEMENT",
                                       "" if tol is None else " (tolerance %g)" % tol))
    if ok and rm:
        shutil.rmtree(root)
    return 0 if ok else 1
