// app.js — the dashboard's router: the daemon answers the same page for /, /jobs/{id} and
// /compare, and this picks the view from the location.
import { h, clear, banner } from "./util.js";
import { queuePage } from "./queue.js";
import { jobPage } from "./job.js";
import { comparePage } from "./compare.js";

async function route() {
  const main = document.getElementById("main");
  const path = location.pathname.replace(/\/+$/, "") || "/";
  let m;
  try {
    if (path === "/") {
      document.getElementById("nav-queue").classList.add("here");
      await queuePage(main);
    } else if ((m = /^\/jobs\/(\d+)$/.exec(path))) {
      await jobPage(main, Number(m[1]));
    } else if (path === "/compare") {
      document.getElementById("nav-compare").classList.add("here");
      await comparePage(main, new URLSearchParams(location.search));
    } else {
      clear(main, h("h1", {}, "Not found"), h("p", {}, h("a", { href: "/" }, "the queue")));
    }
  } catch (e) {
    banner(e.message || String(e));
    console.error(e);
  }
  document.body.dataset.ready = "1";   // the first load is drawn (tests wait for it)
}

route();
