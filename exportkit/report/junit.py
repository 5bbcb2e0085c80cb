"""JUnit XML, as CI systems read it: text made safe for XML 1.0, and the document around one test suite."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from exportkit.report.format import clean

_XML_BAD = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
COUNTS = ("tests", "failures", "errors", "skipped", "time")


def xml_text(s: Any) -> str:
    """Text safe for XML 1.0 (TF error logs may hold ANSI escapes and other control characters)."""
    return _XML_BAD.sub("?", clean("" if s is None else str(s)))


def junit_document(suite: ET.Element) -> str:
    """The XML document: `<testsuites name="exportkit">` around `suite`, carrying the suite's counts
    (tests, failures, errors, skipped, time)."""
    root = ET.Element("testsuites", name="exportkit", **{k: suite.get(k) for k in COUNTS})
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
