"""Compare two folders of compile dumps (gluon_compile_check.py / gluon_bwd_compile_check.py --dump DIR): is the
generated code of each case the same? For moves and renames of kernel code, which must not change what compiles.

    python tests/compare_compile_dumps.py BEFORE_DIR AFTER_DIR

PTX is compared line by line without `.loc` / `.file` directives, comments and the debug sections (they name source
files and lines, which a move changes); ptxas reports without their compile time. Compile the two trees with
separate TRITON_CACHE_DIRs: triton's cache key does not hold a function's file, so a moved but unchanged function
would otherwise be served from the first tree's cache. Exits 1 if a case differs, is in one folder only, or if no case
was compared (an empty or mistyped folder).
"""
import os
import re
import sys


def ptx_lines(path):
    lines = []
    for line in open(path):
        text = line.strip()
        if text.startswith(".section") and ".debug" in text:
            break
        if text and not text.startswith((".loc", ".file", "//")):
            lines.append(re.sub(r"\s*//.*$", "", line.rstrip()))
    return lines


def report_lines(path):
    return [line for line in open(path) if "Compile time" not in line]


def main(before, after):
    same, differ, missing = 0, [], []
    for name in sorted(os.listdir(before)):
        read = ptx_lines if name.endswith(".ptx") else report_lines if name.endswith(".ptxas.txt") else None
        if read is None:
            continue
        if not os.path.exists(os.path.join(after, name)):
            missing.append(name)
        elif read(os.path.join(before, name)) == read(os.path.join(after, name)):
            same += 1
        else:
            differ.append(name)
    extra = sorted(name for name in os.listdir(after) if name.endswith((".ptx", ".ptxas.txt"))
                   and not os.path.exists(os.path.join(before, name)))
    for name in differ:
        print("differs:", name)
    for name in missing + extra:
        print("in one folder only:", name)
    print(f"{before} -> {after}: {same} the same, {len(differ)} different, {len(missing) + len(extra)} in one folder "
          f"only")
    return 1 if differ or missing or extra or not same else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
