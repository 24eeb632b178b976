// overnight ui: live tables poll only while the tab is visible (a hidden tab skips its polls; the
// next one after it is shown runs as usual). A file, not an inline script: the CSP forbids those.
document.addEventListener("htmx:beforeRequest", function (e) {
  var elt = e.detail && e.detail.elt;
  if (document.hidden && elt && elt.hasAttribute && elt.hasAttribute("data-poll")) { e.preventDefault(); }
});
