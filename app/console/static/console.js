// Treadle console: live refresh of marked regions, nothing else. Without JavaScript every
// page still works (reload it); confirmations are server-side pages.
(function () {
  "use strict";
  function refresh(el) {
    var url = el.getAttribute("data-refresh");
    var seconds = parseFloat(el.getAttribute("data-refresh-seconds") || "3");
    if (!url || !(seconds > 0) || el.querySelector("[data-refresh-stop]")) { return; }
    var busy = false;
    var timer = window.setInterval(function () {
      // Skip while hidden, busy, or while the user is working inside the region.
      if (busy || document.hidden || el.contains(document.activeElement)) { return; }
      busy = true;
      fetch(url, { credentials: "same-origin", headers: { "X-Console-Fragment": "1" } })
        .then(function (resp) {
          if (resp.status === 401) {
            // The session ended (idle, signed out elsewhere, token revoked): say so on
            // the sign-in page, and come back to this page after it.
            var here = window.location.pathname + window.location.search;
            window.location.assign("/ui/login?expired=1&next=" + encodeURIComponent(here));
            return null;
          }
          if (resp.redirected) { window.location.reload(); return null; }
          return resp.ok ? resp.text() : null;
        })
        .then(function (html) {
          // The fragment is server-rendered, autoescaped HTML of the same origin.
          if (html === null || html === undefined) { return; }
          // Keep open <details> open across the swap (they carry ids).
          var open = [];
          var shown = el.querySelectorAll("details[id][open]");
          for (var i = 0; i < shown.length; i++) { open.push(shown[i].id); }
          el.innerHTML = html;
          for (var j = 0; j < open.length; j++) {
            var d = document.getElementById(open[j]);
            if (d) { d.open = true; }
          }
          // A finished run's page stops refreshing.
          if (el.querySelector("[data-refresh-stop]")) { window.clearInterval(timer); }
        })
        .catch(function () { /* offline for a moment: try again next tick */ })
        .then(function () { busy = false; });
    }, seconds * 1000);
  }
  document.addEventListener("DOMContentLoaded", function () {
    var regions = document.querySelectorAll("[data-refresh]");
    for (var i = 0; i < regions.length; i++) { refresh(regions[i]); }
  });
})();
