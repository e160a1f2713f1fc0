// The ipywidgets page manager (embed-amd.js) typesets widget labels with the MathJax 2 API,
// MathJax.Hub.Queue(["Typeset", MathJax.Hub, element]); the book loads MathJax 3, which has no Hub, so every
// widget label would throw "Cannot read properties of undefined (reading 'Queue')".
// Loaded with `defer` right after MathJax 3 (book/_ext/offline_js.py): give it a Hub.Queue that typesets the
// element with the MathJax 3 API, queued behind MathJax's own start-up typesetting.
(function () {
  var MJ = window.MathJax;
  if (!MJ || MJ.Hub || !MJ.startup) return; // no MathJax on this page, or a MathJax 2
  MJ.Hub = {
    Queue: function (job) {
      var element = Array.isArray(job) ? job[2] : undefined;
      MJ.startup.promise = MJ.startup.promise.then(function () {
        return MJ.typesetPromise(element ? [element] : undefined);
      }).catch(function (err) { console.warn("MathJax typeset of a widget failed:", err); });
      return MJ.startup.promise;
    }
  };
})();
