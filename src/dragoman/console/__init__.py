"""The operator console at /console: server-rendered pages (Jinja2), one small script of
ours and uPlot (vendored, see static/vendor/), over one JSON endpoint per view. On when an
admin key exists. See docs/console.md."""
