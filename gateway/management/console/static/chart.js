// A small line chart on a <canvas>: samples kept by the page while it is open (the API gives
// current rates and depths, not their history).
import { h } from './dom.js';

const COLOURS = ['#1f6feb', '#d2691e', '#2e8b57', '#8a2be2', '#b22222'];
const KEEP_MS = 10 * 60 * 1000;

export class Series {
  constructor(names) { this.names = names; this.points = []; }
  add(values) {
    const now = Date.now();
    this.points.push([now, values]);
    while (this.points.length && this.points[0][0] < now - KEEP_MS) this.points.shift();
  }
}

export function chart(series, { label, unit = '' } = {}) {
  const canvas = h('canvas', { width: 640, height: 160, role: 'img', 'aria-label': label || 'chart' });
  const legend = h('p', { class: 'legend' });
  const wrap = h('figure', { class: 'chart' }, canvas, legend);
  function draw() {
    const g = canvas.getContext('2d');
    const W = canvas.width; const H = canvas.height; const pad = 30;
    g.clearRect(0, 0, W, H);
    g.font = '11px sans-serif';
    g.fillStyle = '#555';
    const pts = series.points;
    let max = 0;
    for (const [, vals] of pts) for (const v of vals) max = Math.max(max, v || 0);
    max = max || 1;
    g.strokeStyle = '#ccc';
    g.beginPath(); g.moveTo(pad, 5); g.lineTo(pad, H - 15); g.lineTo(W - 5, H - 15); g.stroke();
    g.fillText(String(Math.round(max * 10) / 10), 2, 12);
    g.fillText('0', 2, H - 15);
    g.fillText('last 10 min', W - 70, H - 2);
    if (pts.length) {
      const t1 = pts[pts.length - 1][0]; const t0 = t1 - KEEP_MS;
      const x = (t) => pad + ((t - t0) / KEEP_MS) * (W - pad - 5);
      const y = (v) => H - 15 - ((v || 0) / max) * (H - 25);
      series.names.forEach((_, i) => {
        g.strokeStyle = COLOURS[i % COLOURS.length];
        g.lineWidth = 2;
        g.beginPath();
        pts.forEach(([t, vals], j) => { if (j) g.lineTo(x(t), y(vals[i])); else g.moveTo(x(t), y(vals[i])); });
        g.stroke();
      });
    }
    const last = pts.length ? pts[pts.length - 1][1] : [];
    legend.replaceChildren(...series.names.map((n, i) => h('span', { class: `swatch c${i}` },
      `${n}: ${last[i] === undefined ? '-' : (Math.round(last[i] * 10) / 10).toLocaleString('en')}${unit}`)));
  }
  return { el: wrap, draw };
}
