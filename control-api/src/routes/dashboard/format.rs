//! How the pages write numbers, times and charts: sizes and rates with
//! units (`451.5 MB`, `3.2 MB/s`), times relative with the RFC 3339 instant
//! in a `title`, and hand-drawn SVG charts with a time axis, a value scale
//! with units and a `<title>` (the hover value) on every point.

use super::*;

/// A size in bytes, SI units: `0 B`, `812 B`, `451.5 MB`.
pub(crate) fn bytes(n: f64) -> String {
    const UNITS: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    let mut v = if n.is_finite() { n.max(0.0) } else { 0.0 };
    let mut i = 0;
    while v >= 999.95 && i < UNITS.len() - 1 {
        v /= 1000.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// A rate in bytes per second: `3.2 MB/s`.
pub(crate) fn rate(n: f64) -> String {
    format!("{}/s", bytes(n))
}

pub(crate) fn per_sec(n: f64) -> String {
    format!("{n:.1}/s")
}

pub(crate) fn millis(n: f64) -> String {
    format!("{n:.1} ms")
}

pub(crate) fn percent(n: f64) -> String {
    format!("{:.1} %", n * 100.0)
}

pub(crate) fn plain(n: f64) -> String {
    format!("{n:.2}")
}

/// `12 s ago`, `3 min ago`, `in 5 h`.
pub(crate) fn relative(secs: i64) -> String {
    let a = secs.unsigned_abs();
    let span = if a < 60 {
        format!("{a} s")
    } else if a < 3600 {
        format!("{} min", a / 60)
    } else if a < 86_400 {
        format!("{} h", a / 3600)
    } else {
        format!("{} d", a / 86_400)
    };
    if secs >= 0 {
        format!("{span} ago")
    } else {
        format!("in {span}")
    }
}

/// An instant as `<time>`: relative text, the RFC 3339 instant in `title`
/// and `datetime` (the page's script keeps the text current).
pub(crate) fn when(t: DateTime<Utc>) -> String {
    let iso = t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    format!(
        "<time datetime=\"{iso}\" title=\"{iso}\" data-rel>{}</time>",
        relative((Utc::now() - t).num_seconds())
    )
}

pub(crate) fn when_opt(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(|| "–".to_owned(), when)
}

/// A duration from now in milliseconds: `4 min 10 s`.
pub(crate) fn time_left(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    if s >= 3600 {
        format!("{} h {} min", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{} min {} s", s / 60, s % 60)
    } else {
        format!("{s} s")
    }
}

fn clock(t: i64, fmt: &str) -> String {
    DateTime::<Utc>::from_timestamp(t, 0).map_or_else(String::new, |d| d.format(fmt).to_string())
}

/// How a chart labels its time axis.
#[derive(Clone, Copy)]
pub(crate) enum Axis {
    /// `HH:MM` (UTC; `HH:MM:SS` when the span is under five minutes).
    Clock,
    /// `MM-DD`, one bar a day.
    Days,
}

/// An SVG chart of `(unix time, value)` points: a time axis with labels,
/// a value scale in `unit`, and every point's value on hover (`<title>`).
pub(crate) fn chart(
    label: &str,
    points: &[(i64, f64)],
    unit: fn(f64) -> String,
    axis: Axis,
) -> String {
    chart_to(label, points, unit, axis, None)
}

/// [`chart`] with a fixed top of scale when every value is under it (ratios: 1).
pub(crate) fn chart_to(
    label: &str,
    points: &[(i64, f64)],
    unit: fn(f64) -> String,
    axis: Axis,
    top_of_scale: Option<f64>,
) -> String {
    let (w, h, left, right, top, bottom) = (460.0_f64, 160.0_f64, 74.0, 12.0, 12.0, 24.0);
    let label = esc(label);
    let enough = match axis {
        Axis::Clock => points.len() >= 2,
        Axis::Days => !points.is_empty(),
    };
    if !enough {
        return format!(
            "<figure class=\"chart\"><figcaption>{label}</figcaption><svg class=\"chart\" viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"{label}: no data yet\">\
<text x=\"{}\" y=\"{}\" class=\"empty\">collecting… (no data yet)</text></svg></figure>",
            w / 2.0 - 80.0,
            h / 2.0
        );
    }
    let (t0, t1) = (points[0].0, points[points.len() - 1].0);
    let span = (t1 - t0).max(1) as f64;
    let max = points
        .iter()
        .map(|p| p.1)
        .filter(|v| v.is_finite())
        .fold(0.0_f64, f64::max);
    let max = match top_of_scale {
        Some(t) if max <= t => t,
        _ if max <= 0.0 => 1.0,
        _ => max * 1.1,
    };
    let (pw, ph) = (w - left - right, h - top - bottom);
    let slot = pw / points.len().max(1) as f64;
    let x = |t: i64| match axis {
        Axis::Clock => left + (t - t0) as f64 / span * pw,
        Axis::Days => left + ((t - t0) as f64 / 86_400.0) * slot + slot / 2.0,
    };
    let y = |v: f64| top + ph - (v.max(0.0) / max) * ph;
    let mut svg = format!(
        "<figure class=\"chart\"><figcaption>{label}</figcaption><svg class=\"chart\" viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"{label}\">"
    );
    // The value scale: gridlines at 0, ½ and the top, labelled in `unit`.
    for f in [0.0, 0.5, 1.0] {
        let v = max * f;
        let yy = y(v);
        let _ = write!(
            svg,
            "<line class=\"grid\" x1=\"{left}\" x2=\"{}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\"/>\
<text class=\"y-label\" x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            w - right,
            left - 4.0,
            yy + 3.0,
            esc(&unit(v))
        );
    }
    // The time axis.
    let fmt = match axis {
        Axis::Clock if t1 - t0 < 300 => "%H:%M:%S",
        Axis::Clock => "%H:%M",
        Axis::Days => "%m-%d",
    };
    let ticks: Vec<i64> = match axis {
        Axis::Clock => (0..=4).map(|i| t0 + (t1 - t0) * i / 4).collect(),
        Axis::Days => {
            let every = (points.len() / 6).max(1);
            points.iter().step_by(every).map(|p| p.0).collect()
        }
    };
    let mut last = String::new();
    let (first_tick, last_tick) = (
        ticks.first().copied().unwrap_or(t0),
        ticks.last().copied().unwrap_or(t1),
    );
    for t in ticks {
        let text = clock(t, fmt);
        if text == last {
            continue;
        }
        let xx = x(t);
        // The outer labels stay inside the chart.
        let anchor = match axis {
            Axis::Clock if t == last_tick && t != first_tick => "end",
            Axis::Clock if t == first_tick => "start",
            _ => "middle",
        };
        let _ = write!(
            svg,
            "<line class=\"tick\" x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{}\" y2=\"{}\"/>\
<text class=\"t-label\" x=\"{xx:.1}\" y=\"{}\" text-anchor=\"{anchor}\">{text}</text>",
            top + ph,
            top + ph + 4.0,
            h - 6.0
        );
        last = text;
    }
    let _ = write!(
        svg,
        "<line class=\"axis\" x1=\"{left}\" x2=\"{left}\" y1=\"{top}\" y2=\"{}\"/>",
        top + ph
    );
    let point_fmt = match axis {
        Axis::Clock => "%Y-%m-%d %H:%M:%S UTC",
        Axis::Days => "%Y-%m-%d",
    };
    match axis {
        Axis::Clock => {
            let coords: Vec<String> = points
                .iter()
                .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
                .collect();
            let _ = write!(
                svg,
                "<polyline class=\"line\" points=\"{}\"/>",
                coords.join(" ")
            );
            for (t, v) in points {
                let _ = write!(
                    svg,
                    "<circle class=\"pt\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\"><title>{} — {}</title></circle>",
                    x(*t),
                    y(*v),
                    clock(*t, point_fmt),
                    esc(&unit(*v))
                );
            }
        }
        Axis::Days => {
            for (t, v) in points {
                let yy = y(*v);
                let _ = write!(
                    svg,
                    "<rect class=\"bar\" x=\"{:.1}\" y=\"{yy:.1}\" width=\"{:.1}\" height=\"{:.1}\"><title>{} — {}</title></rect>",
                    x(*t) - slot * 0.4,
                    slot * 0.8,
                    (top + ph - yy).max(0.5),
                    clock(*t, point_fmt),
                    esc(&unit(*v))
                );
            }
        }
    }
    svg.push_str("</svg></figure>");
    svg
}

/// A quota bar: used of total, as text and as a bar (not colour alone).
pub(crate) fn quota_bar(used: i64, total: Option<i64>) -> String {
    match total {
        None => format!("{} used · no quota", bytes(used as f64)),
        Some(total) => {
            let pct = if total > 0 {
                (used as f64 / total as f64 * 100.0).clamp(0.0, 100.0)
            } else {
                100.0
            };
            let level = if pct >= 100.0 {
                "full"
            } else if pct >= 80.0 {
                "warn"
            } else {
                "ok"
            };
            format!(
                "<div class=\"quota {level}\" role=\"meter\" aria-valuemin=\"0\" aria-valuemax=\"100\" aria-valuenow=\"{pct:.0}\">\
<span style=\"width:{pct:.1}%\"></span></div> {} of {} ({pct:.0} %{})",
                bytes(used as f64),
                bytes(total as f64),
                match level {
                    "full" => ", exhausted",
                    "warn" => ", warning",
                    _ => "",
                }
            )
        }
    }
}

/// A form posting `action` to `path` with the session's CSRF token; `extra`
/// is more of the form (a reason field).
pub(super) fn action_form(
    v: &Viewer,
    path: &str,
    id: &str,
    label: &str,
    class: &str,
    extra: &str,
) -> String {
    format!(
        "<form method=\"post\" action=\"{}\" class=\"inline\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">{extra}\
<button type=\"submit\" id=\"{}\" class=\"{class}\">{}</button></form>",
        esc(path),
        esc(&v.csrf),
        esc(id),
        esc(label)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_rates_carry_units() {
        assert_eq!(bytes(0.0), "0 B");
        assert_eq!(bytes(812.0), "812 B");
        assert_eq!(bytes(451_523_866.0), "451.5 MB");
        assert_eq!(bytes(1_000.0), "1.0 kB");
        assert_eq!(rate(3_200_000.0), "3.2 MB/s");
        assert_eq!(bytes(f64::NAN), "0 B");
    }

    #[test]
    fn times_are_relative() {
        assert_eq!(relative(12), "12 s ago");
        assert_eq!(relative(125), "2 min ago");
        assert_eq!(relative(-7200), "in 2 h");
        assert_eq!(time_left(250_000), "4 min 10 s");
    }

    #[test]
    fn a_chart_has_time_labels_a_scale_and_hover_values() {
        let t0 = 1_700_000_000;
        let points: Vec<(i64, f64)> = (0..60).map(|i| (t0 + i * 10, i as f64 * 1e5)).collect();
        let svg = chart("throughput", &points, rate, Axis::Clock);
        assert!(svg.contains("class=\"t-label\""), "{svg}");
        assert!(svg.contains("MB/s</text>"), "{svg}");
        assert_eq!(svg.matches("<title>").count(), 60);
        let empty = chart("x", &[], rate, Axis::Clock);
        assert!(empty.contains("no data yet"));
        let days = chart("per day", &[(t0, 5e9)], bytes, Axis::Days);
        assert!(days.contains("<rect"), "{days}");
    }
}
