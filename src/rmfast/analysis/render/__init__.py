"""Drawing and HTML: the analyses' matplotlib figures (:mod:`.plots`, Agg canvas, no pyplot state) and the
report's escaped tables and embedded PNGs (:mod:`.report_html`). Imported by the papers' analyses, the
representations and the report; imports only :mod:`..data`."""
