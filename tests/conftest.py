import os
import shutil
import tempfile

# Built models (model=tiny) go to a cache private to this test session, never the user's; removed at the end.
_OWN_CACHE = None
if "RETOOL_CACHE" not in os.environ:
    _OWN_CACHE = os.environ["RETOOL_CACHE"] = tempfile.mkdtemp(prefix="retool-test-cache-")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE is not None:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)
