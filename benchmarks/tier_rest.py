"""The GPU tier's test ids that did not pass or skip in earlier logs, for a follow-up call (a fresh machine compiles
every kernel anew, and a tier part can run past the call's limit):

    python3 benchmarks/tier_rest.py OUT/part1/gpu-tier.txt OUT/part2/gpu-tier.txt > tier-rest.txt
    bash benchmarks/gpu_session.sh tests ids tier-rest.txt     # on the device

Reads `pytest -v` logs (what gpu_session.sh's tests phase writes); the tier's ids come from a local
`--collect-only` of both parts' selection, which a machine without a GPU collects the same way."""
import re
import subprocess
import sys

SELECTION = "not flex_mods_match and not kernels_compile"  # gpu_session.sh's -k


def tier_ids():
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests",
                          "-k", SELECTION], capture_output=True, text=True, check=True)
    return [line.strip() for line in run.stdout.splitlines() if "::" in line]


def finished(logs):
    done = set()
    for log in logs:
        with open(log) as f:
            for line in f:
                m = re.search(r"(PASSED|SKIPPED|XFAIL|XPASS)\s+(tests/.+?)\s*$", line)  # ids may hold spaces
                if m:
                    done.add(m.group(2))
    return done


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    done = finished(sys.argv[1:])
    rest = [i for i in tier_ids() if i not in done]
    if rest:  # nothing at all when none is left: an empty line would make pytest collect the whole suite
        print("\n".join(rest))
    print(f"{len(rest)} of the tier's ids did not pass or skip in {len(sys.argv) - 1} log(s)", file=sys.stderr)


if __name__ == "__main__":
    main()
