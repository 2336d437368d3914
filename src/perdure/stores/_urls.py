"""Store URLs as they may be shown: with any password masked.

The one redactor of the project: banners, logs and errors show a store's URL through
it, whatever the backend (``App.store_url``, ``open_store``'s errors, a store's
``url``).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

__all__ = ["redact_url"]

# ``password=VALUE`` in a libpq keyword string (``host=db password=s3cret``): VALUE is
# quoted (backslash escapes inside) or runs to the next space.
_KEYWORD_PASSWORD = re.compile(
    r"(?P<key>(?:^|(?<=\s))password\s*=\s*)(?P<value>'(?:\\.|[^'\\])*'?|(?:\\.|[^\s\\])+)")


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for banners, logs and errors).

    A URL's password (``postgresql://user:***@host/db``), or the ``password`` of a
    libpq keyword string (``host=db password=***``); anything else is left as it is.
    """
    if "://" not in url:
        return _KEYWORD_PASSWORD.sub(r"\g<key>***", url)
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user.partition(':')[0]}:***@{host}"))
