"""A prefill instance's KV source in a process of its own, for the kill test: it holds two caches
(``random_cache(identity(), 6, seed=0)`` and ``seed=1``), prints ``{"engine", "ids"}`` and waits to be killed."""

import json
import sys
import time

from test_pd_link import identity, random_cache

from hetero.serve.pd.transfer import KVSource

source = KVSource(f"127.0.0.1:{sys.argv[1]}", identity(), None, 4)
ids = [source.hold(random_cache(identity(), 6, seed=seed)) for seed in (0, 1)]
print(json.dumps({"engine": source.server.engine_id, "ids": ids}), flush=True)
while True:
    time.sleep(60)
