// Charts and tables drawn from the data behind a cell's figure or DataFrame (the server checked
// its shape: sandbox/rich_data.py). Chart.js (chart.umd.min.js, MIT, served from here) draws on
// a canvas; the hovered element's label and value are also DOM text, in the tooltip. Every
// label is model- or file-made: it reaches the page as text (textContent, canvas text), never
// as HTML. A figure whose data cannot be drawn is its PNG, as before. Elements are made with
// page.js's el(), which these functions call once the page has loaded.
"use strict";

const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
  "#ff9da7", "#9c755f", "#bab0ac"];
const DRAWN = ["line", "scatter", "bar", "pie", "box_and_whisker"];
const MANY_POINTS = 200; // past this a series is drawn as a line alone, without its dots

// The figure of a cell: its chart(s) drawn from `chart` with a link to the PNG; the PNG itself
// when nothing can be drawn, and beside what was drawn when a part of the figure could not be.
function figure(url, chart) {
  const picture = () => el("img", { class: "chart", testid: "chart", src: url, alt: "figure" });
  const parts = chart && chart.type === "superchart" ? chart.elements || [] : [chart];
  const drawable = parts.filter((part) => part && DRAWN.includes(part.type));
  if (typeof window.Chart !== "function" || drawable.length === 0) return picture();
  const box = el("figure", { class: "chart-box", testid: "chart" });
  if (chart.type === "superchart" && chart.title) box.append(el("figcaption", { text: chart.title }));
  let drawn = 0;
  for (const part of drawable) {
    try {
      box.append(canvasChart(part));
      drawn += 1;
    } catch (error) { // a chart the library refuses: the picture shows it
      console.warn("chart not drawn", error);
    }
  }
  if (drawn < parts.length) {
    if (drawn === 0) return picture();
    box.append(picture());
  }
  box.append(el("a", { class: "chart-png", testid: "chart-png", href: url, download: "",
    text: "Image (PNG)" }));
  return box;
}

function canvasChart(chart) {
  const canvas = el("canvas", { role: "img", "aria-label": chart.title || `${chart.type} chart` });
  const tooltip = el("div", { class: "chart-tooltip", testid: "chart-tooltip", role: "status" });
  tooltip.hidden = true;
  const wrap = el("div", { class: "chart-canvas" }, canvas, tooltip);
  const config = CONFIGS[chart.type](chart);
  config.options = {
    animation: false,
    responsive: true,
    maintainAspectRatio: true,
    interaction: { mode: "nearest", axis: chart.type === "line" ? "x" : "xy", intersect: chart.type !== "line" },
    ...config.options,
    plugins: {
      title: { display: Boolean(chart.title), text: chart.title || "" },
      legend: { display: config.data.datasets.length > 1 || chart.type === "pie" },
      tooltip: { enabled: false, external: showTooltip(tooltip), ...(config.tooltip || {}) },
    },
  };
  delete config.tooltip;
  new window.Chart(canvas, config);
  return wrap;
}

// Chart.js's tooltip as text in the page: the hovered element's label and value(s).
function showTooltip(box) {
  return ({ tooltip }) => {
    if (!tooltip || tooltip.opacity === 0) {
      box.hidden = true;
      return;
    }
    const lines = [...(tooltip.title || []), ...(tooltip.body || []).flatMap((b) => b.lines)];
    box.textContent = lines.join("\n");
    box.style.left = `${Math.round(tooltip.caretX) + 12}px`;
    box.style.top = `${Math.round(tooltip.caretY) + 12}px`;
    box.hidden = false;
  };
}

function axes(chart, xType) {
  const axis = (type, label, scale) => ({
    type: scale === "log" && type === "linear" ? "logarithmic" : type,
    title: { display: Boolean(label), text: label || "" },
  });
  return { x: axis(xType, chart.x_label, chart.x_scale), y: axis("linear", chart.y_label, chart.y_scale) };
}

function color(i) {
  return PALETTE[i % PALETTE.length];
}

function pointChart(chart, type) {
  const series = chart.elements || [];
  const numeric = series.every((s) => s.points.every((p) => typeof p[0] === "number" || p[0] === null));
  const labels = [];
  if (!numeric) { // dates and categories: each x as a category, dates in time order
    const seen = new Set();
    for (const s of series) for (const [x] of s.points) if (!seen.has(String(x))) {
      seen.add(String(x));
      labels.push(String(x));
    }
    if (chart.x_scale === "datetime") labels.sort(); // ISO texts sort as the times they name
  }
  const datasets = series.map((s, i) => ({
    label: s.label,
    data: s.points.map(([x, y]) => ({ x: numeric ? x : String(x), y })),
    borderColor: color(i),
    backgroundColor: color(i),
    pointRadius: type === "line" && s.points.length > MANY_POINTS ? 0 : 3,
    showLine: type === "line",
  }));
  return {
    type: type === "line" ? "line" : "scatter",
    data: numeric ? { datasets } : { labels, datasets },
    options: { scales: axes(chart, numeric ? "linear" : "category") },
  };
}

const CONFIGS = {
  line: (chart) => pointChart(chart, "line"),
  scatter: (chart) => pointChart(chart, "scatter"),
  bar(chart) { // each group's k-th bar in the k-th slot: names may repeat (a histogram's, an index's)
    const groups = new Map();
    for (const bar of chart.elements || []) {
      if (!groups.has(bar.group)) groups.set(bar.group, []);
      groups.get(bar.group).push(bar);
    }
    const slots = Math.max(0, ...[...groups.values()].map((bars) => bars.length));
    const labels = Array.from({ length: slots }, (_, k) => {
      for (const bars of groups.values()) if (bars[k]) return bars[k].label;
      return "";
    });
    const datasets = [...groups].map(([group, bars], i) => ({
      label: group,
      data: labels.map((_, k) => (bars[k] ? bars[k].value : null)),
      backgroundColor: color(i),
    }));
    return { type: "bar", data: { labels, datasets }, options: { scales: axes(chart, "category") } };
  },
  pie(chart) {
    const wedges = chart.elements || [];
    return {
      type: "pie",
      data: {
        labels: wedges.map((w) => w.label),
        datasets: [{ data: wedges.map((w) => w.angle), backgroundColor: wedges.map((_, i) => color(i)) }],
      },
      tooltip: { callbacks: { label: (item) => `${(item.raw / 3.6).toFixed(1)}%` } },
    };
  },
  box_and_whisker(chart) { // each box as a bar from its first to its third quartile
    const boxes = chart.elements || [];
    const five = (b) => `min ${b.min}, q1 ${b.first_quartile}, median ${b.median}, ` +
      `q3 ${b.third_quartile}, max ${b.max}` + (b.outliers.length ? `, ${b.outliers.length} outliers` : "");
    return {
      type: "bar",
      data: {
        labels: boxes.map((b) => b.label),
        datasets: [{ label: "first to third quartile", data: boxes.map((b) => [b.first_quartile, b.third_quartile]),
          backgroundColor: color(0) }],
      },
      options: { scales: axes(chart, "category") },
      tooltip: { callbacks: { label: (item) => five(boxes[item.dataIndex]) } },
    };
  },
};

// A DataFrame's first rows as a table whose columns sort by a click on their header.
function dataTable(table) {
  const box = el("div", { class: "table", testid: "table" });
  const [rows, columns] = table.shape;
  let meta = `${rows} rows × ${columns} columns`;
  if (table.rows.length < rows || table.columns.length < columns) {
    meta += ` (the first ${table.rows.length} rows and ${table.columns.length} columns)`;
  }
  box.append(el("div", { class: "meta", text: meta }));
  const names = [table.index.name ?? "", ...table.columns.map((c) => c.name)];
  const types = ["index", ...table.columns.map((c) => c.dtype)];
  const data = table.rows.map((row, i) => [table.index.values[i], ...row]);
  const body = el("tbody");
  const head = el("tr");
  let sorted = { column: -1, ascending: true };
  names.forEach((name, column) => {
    const button = el("button", { type: "button", class: "sort", title: `sort by ${name} (${types[column]})`,
      text: String(name) });
    const th = el("th", { scope: "col", "aria-sort": "none" }, button);
    button.addEventListener("click", () => {
      const ascending = sorted.column === column ? !sorted.ascending : true;
      sorted = { column, ascending };
      data.sort((a, b) => compare(a[column], b[column], ascending));
      for (const cell of head.children) cell.setAttribute("aria-sort", "none");
      th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
      fill(body, data);
    });
    head.append(th);
  });
  fill(body, data);
  box.append(el("table", {}, el("thead", {}, head), body));
  return box;
}

function fill(body, data) {
  body.replaceChildren(...data.map((row) =>
    el("tr", {}, ...row.map((value, i) => el(i === 0 ? "th" : "td", { text: value === null ? "" : String(value) })))));
}

// Numbers by value, texts in the reader's collation, empty cells last either way.
function compare(a, b, ascending) {
  if (a === null || a === undefined) return b === null || b === undefined ? 0 : 1;
  if (b === null || b === undefined) return -1;
  const order = typeof a === "number" && typeof b === "number"
    ? a - b : String(a).localeCompare(String(b), undefined, { numeric: true });
  return ascending ? order : -order;
}

window.sandcellCharts = { figure, dataTable };
