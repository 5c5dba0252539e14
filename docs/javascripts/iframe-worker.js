/*
 * Site search for a copy of the site opened from disk (file://), with no network.
 *
 * Material runs its search in a Web Worker, and browsers refuse to start a Worker from a file://
 * page. On file:// only, this script replaces `Worker` with `IFrameWorker`: the worker's script runs
 * in a hidden iframe of the same page, and messages pass between page and frame as DOM events.
 * Material's search worker looks for `IFrameWorker` on its parent to find its lunr files, and awaits
 * `importScripts`, so this one returns a promise. Over HTTP nothing is replaced: the real Worker runs.
 *
 * The offline plugin of mkdocs-material would otherwise add a shim of this kind from unpkg.com, which
 * a reader without network cannot load; it leaves that out when a polyfill whose URL names
 * "iframe-worker" is listed (mkdocs.yml, `extra.polyfills`). Written for accel; no copied code.
 */
(function () {
  "use strict";
  if (window.location.protocol !== "file:" || window.IFrameWorker) {
    return;
  }

  function loadScript(frameDocument, url) {
    return new Promise(function (resolve, reject) {
      var script = frameDocument.createElement("script");
      script.src = url;
      script.onload = function () {
        resolve();
      };
      script.onerror = function () {
        reject(new Error("iframe-worker: could not load " + url));
      };
      (frameDocument.head || frameDocument.documentElement).appendChild(script);
    });
  }

  function copy(data) {
    return typeof structuredClone === "function" ? structuredClone(data) : data;
  }

  class IFrameWorker extends EventTarget {
    constructor(url) {
      super();
      this.onmessage = null;
      this.onerror = null;
      this._queue = [];
      this._ready = false;
      var frame = document.createElement("iframe");
      frame.hidden = true;
      frame.title = "search worker";
      frame.setAttribute("aria-hidden", "true");
      frame.tabIndex = -1;
      (document.body || document.documentElement).appendChild(frame);
      this._frame = frame;
      var scope = frame.contentWindow;
      var frameDocument = frame.contentDocument;
      var worker = this;
      // What the worker's code calls as globals: postMessage answers the page, importScripts loads more.
      scope.postMessage = function (data) {
        worker._emit("message", copy(data));
      };
      scope.importScripts = function () {
        var urls = Array.prototype.slice.call(arguments);
        return urls.reduce(function (done, next) {
          return done.then(function () {
            return loadScript(frameDocument, new URL(next, document.baseURI).href);
          });
        }, Promise.resolve());
      };
      loadScript(frameDocument, new URL(url, document.baseURI).href).then(
        function () {
          worker._ready = true;
          worker._queue.splice(0).forEach(function (data) {
            worker._send(data);
          });
        },
        function (error) {
          worker._emit("error", error);
        }
      );
    }

    postMessage(data) {
      if (this._ready) {
        this._send(copy(data));
      } else {
        this._queue.push(copy(data));
      }
    }

    terminate() {
      this._ready = false;
      this._queue = [];
      this._frame.remove();
    }

    _send(data) {
      var scope = this._frame.contentWindow;
      if (!scope) {
        return;
      }
      setTimeout(function () {
        scope.dispatchEvent(new scope.MessageEvent("message", { data: data }));
      }, 0);
    }

    _emit(type, payload) {
      var worker = this;
      setTimeout(function () {
        var event =
          type === "message"
            ? new MessageEvent("message", { data: payload })
            : new ErrorEvent("error", { error: payload, message: String(payload) });
        worker.dispatchEvent(event);
        var handler = type === "message" ? worker.onmessage : worker.onerror;
        if (typeof handler === "function") {
          handler.call(worker, event);
        }
      }, 0);
    }
  }

  window.IFrameWorker = IFrameWorker;
  window.Worker = IFrameWorker;
})();
