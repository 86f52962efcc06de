"""Write N synthetic records (the shape kevload writes) for the comparator benchmark."""

from __future__ import annotations

import hashlib
import sys

import orjson

OUTPUTS = [f"output number {i} " * 8 for i in range(50)]
HASHES = [hashlib.sha256(o.encode()).hexdigest() for o in OUTPUTS]


def main(path: str, n: int) -> None:
    with open(path, "wb", buffering=1 << 20) as handle:
        for seq in range(n):
            level = (1, 2, 4, 8)[seq % 4]
            pick = 0 if level < 4 else seq % 50  # levels 4 and 8 drift over 50 outputs
            t = seq * 0.001
            handle.write(
                orjson.dumps(
                    {
                        "run_id": "bench",
                        "seq": seq,
                        "probe": f"p{seq % 10}",
                        "role": "probe",
                        "mode": "single",
                        "concurrency": level,
                        "rate": None,
                        "sample": seq // 40,
                        "in_flight": level - 1,
                        "status": "ok",
                        "output": OUTPUTS[pick],
                        "sha256": HASHES[pick],
                        "finish_reason": "stop",
                        "prompt_tokens": 7,
                        "completion_tokens": 20,
                        "token_ids": None,
                        "tokens": None,
                        "logprobs": None,
                        "system_fingerprint": None,
                        "t_scheduled": None,
                        "t_send": t,
                        "t_first_byte": t + 0.01,
                        "t_first_token": t + 0.01,
                        "t_last_byte": t + 0.05,
                        "chunks": 20,
                        "max_gap": 0.003,
                        "error": None,
                        "retries": 0,
                        "params": {"temperature": 0, "max_tokens": 20},
                    }
                )
                + b"\n"
            )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
