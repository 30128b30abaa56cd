"""Instructions of rr_quantize_rot256's grid-stride loop in a SASS listing (cuobjdump -sass
of one kernel), without its cold paths: the encode path (taken past a predicated `BRA P, X`
up to the last plain `BRA` before X) and the inf path (the branch after `VOTE.ANY`).

    python3 sass_loop_count.py kernel.sass
"""
import re
import sys
from collections import Counter

BRANCH = re.compile(r"BRA (0x[0-9a-f]+)")


def instructions(path: str) -> list[tuple[int, str]]:
    with open(path) as f:
        found = (re.match(r"\s+/\*([0-9a-f]+)\*/\s+(.*?);", line) for line in f)
        return [(int(m.group(1), 16), m.group(2).strip()) for m in found if m]


def main(path: str) -> None:
    ins = instructions(path)
    back = [(at, int(m.group(1), 16)) for at, text in ins
            if (m := BRANCH.search(text)) and int(m.group(1), 16) < at]
    end, start = max(back, key=lambda b: b[0] - b[1])  # the longest backward branch
    cold = []
    for i, (at, text) in enumerate(ins):
        if not start <= at <= end:
            continue
        if "VOTE.ANY" in text:
            after, branch = ins[i + 1]
            cold.append((after + 16, int(BRANCH.search(branch).group(1), 16)))  # type: ignore[union-attr]
        if m := re.search(r"BRA P\d, (0x[0-9a-f]+)", text):
            target = int(m.group(1), 16)
            plain = [a for a, t in ins if at < a < target and re.match(r"BRA 0x", t)]
            cold.append((at + 16, max(plain) + 16))
    ops = Counter(re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]
                  for at, text in ins
                  if start <= at <= end and not any(a <= at < b for a, b in cold))
    print("loop", hex(start), hex(end), "cold", [(hex(a), hex(b)) for a, b in cold],
          "hot", sum(ops.values()))
    print(ops.most_common())


if __name__ == "__main__":
    main(sys.argv[1])
