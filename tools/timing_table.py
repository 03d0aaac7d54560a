"""Print where a ``make test`` run's time went: every part (make target) with its seconds, and inside
each part the jobs it recorded (a horovodrun job, a test file, a fault or elastic case), then the total.

    python tools/timing_table.py LOG      LOG: the lines tools/timed and tests/conftest.py appended

Each line of LOG: part, job, wall seconds, exit status (tab-separated); a part's own line has job == part.
"""
import sys
from collections import defaultdict


def table(lines):
    parts, jobs = {}, defaultdict(list)
    for line in lines:
        fields = line.rstrip("\n").split("\t")
        if len(fields) != 4:
            continue
        part, job, seconds, status = fields[0], fields[1], float(fields[2]), int(fields[3])
        if job == part:
            parts[part] = (seconds, status)
        else:
            jobs[part].append((job, seconds, status))
    width = max([len(name) + 2 for name in parts] + [len(j) + 4 for js in jobs.values() for j, _, _ in js] + [24])
    out = [f"{'where the time went':<{width}} {'seconds':>8}  share", "-" * (width + 16)]
    total = sum(seconds for seconds, _ in parts.values())
    for part in list(parts) + [p for p in jobs if p not in parts]:
        seconds, status = parts.get(part, (sum(s for _, s, _ in jobs[part]), 0))
        mark = "" if status == 0 else "  FAILED"
        out.append(f"{part:<{width}} {seconds:>8.1f}  {100 * seconds / total if total else 0:4.1f}%{mark}")
        for job, seconds, status in jobs[part]:
            mark = "" if status == 0 else "  FAILED"
            out.append(f"    {job:<{width - 4}} {seconds:>8.1f}{mark}")
    out += ["-" * (width + 16), f"{'total':<{width}} {total:>8.1f}  ({total / 60:.1f} min)"]
    return "\n".join(out)


if __name__ == "__main__":
    try:
        with open(sys.argv[1]) as f:
            print(table(f))
    except FileNotFoundError:
        print(f"no timing recorded ({sys.argv[1]} is missing)")
