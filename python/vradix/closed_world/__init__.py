"""The closed world (docs/coverage.md): SGLang paths vradix cannot version are refused, at launch (`unversioned`,
`epd`) or at a weight update (`post_load`: derived copies an update would leave stale). Pure rules over server args
and live modules; the hooks call them."""
