import os
import tempfile

# Built models (model=tiny) go to a cache private to this test session, never the user's.
os.environ.setdefault("RETOOL_CACHE", tempfile.mkdtemp(prefix="retool-test-cache-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
