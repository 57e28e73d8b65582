//! The SVG chart: failover latency distributions, kube-leader vs client-go, as empirical
//! cumulative distributions (one step per round), one panel per Lease scenario.

use std::path::Path;

use anyhow::anyhow;
use plotters::prelude::*;

use crate::{
    candidate::Impl,
    scenario::lease::{LeaseFailover, Stop},
};

const KUBE_LEADER: RGBColor = RGBColor(0xce, 0x42, 0x2b);
const CLIENT_GO: RGBColor = RGBColor(0x00, 0x7d, 0x9c);
const GOAL: RGBColor = RGBColor(0x88, 0x88, 0x88);

/// Writes the chart to `path`. `title` goes above both panels.
pub(crate) fn write(path: &Path, title: &str, lease: &[LeaseFailover]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1100, 460)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let root = root
        .titled(title, ("sans-serif", 18))
        .map_err(|e| anyhow!("{e}"))?;
    let (left, right) = root.split_horizontally(550);
    for (area, stop) in [(left, Stop::Graceful), (right, Stop::Crash)] {
        let series: Vec<(Impl, Vec<f64>)> = [Impl::KubeLeader, Impl::ClientGo]
            .into_iter()
            .filter_map(|imp| {
                let l = lease.iter().find(|l| l.imp == imp && l.stop == stop)?;
                let ms: Vec<f64> = l.samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
                (!ms.is_empty()).then_some((imp, ms))
            })
            .collect();
        if series.is_empty() {
            continue;
        }
        let timings = lease
            .iter()
            .find(|l| l.stop == stop)
            .map(|l| l.timings)
            .expect("a series has a scenario");
        let (goal_ms, caption) = match stop {
            Stop::Graceful => (100.0, format!("Graceful handover (SIGTERM), {}", timings.label())),
            Stop::Crash => (
                timings.lease.as_secs_f64() * 1e3 + 100.0,
                format!("Crash takeover (SIGKILL), {}", timings.label()),
            ),
        };
        panel(&area, &caption, &series, goal_ms, stop == Stop::Graceful).map_err(|e| anyhow!("{e}"))?;
    }
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

/// One panel. With `log`, x is log10 of milliseconds (labelled in ms / s), else seconds.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    series: &[(Impl, Vec<f64>)],
    goal_ms: f64,
    log: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let x_of = |ms: f64| if log { ms.max(0.01).log10() } else { ms / 1e3 };
    let all: Vec<f64> = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .chain([goal_ms])
        .collect();
    let (lo, hi) = all
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let (x0, x1) = if log {
        (x_of(lo).floor(), x_of(hi).ceil().max(x_of(lo).floor() + 1.0))
    } else {
        let pad = ((hi - lo) / 1e3 * 0.1).max(0.2);
        ((x_of(lo) - pad).max(0.0), x_of(hi) + pad)
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 15))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(x0..x1, 0.0..1.02)?;
    let decades = (x1 - x0).round() as usize + 1;
    chart
        .configure_mesh()
        .x_labels(if log { decades } else { 8 })
        .y_labels(6)
        .light_line_style(WHITE)
        .x_desc(if log {
            "signal → next leader (log scale)"
        } else {
            "signal → next leader (s)"
        })
        .y_desc("fraction of rounds")
        .x_label_formatter(&|v| {
            if log {
                let ms = 10f64.powf(*v);
                if ms >= 1000.0 {
                    format!("{} s", ms / 1000.0)
                } else {
                    format!("{ms} ms")
                }
            } else {
                format!("{v:.1}")
            }
        })
        .y_label_formatter(&|v| format!("{v:.1}"))
        .draw()?;

    // The goal as a vertical line.
    let gx = x_of(goal_ms);
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(gx, 0.0), (gx, 1.02)],
            GOAL.stroke_width(1),
        )))?
        .label(format!(
            "goal ({})",
            crate::stats::fmt(std::time::Duration::from_secs_f64(goal_ms / 1e3))
        ))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], GOAL.stroke_width(1)));

    for (imp, values) in series {
        let color = match imp {
            Impl::KubeLeader | Impl::KubeLeaderHttp2 => KUBE_LEADER,
            Impl::ClientGo => CLIENT_GO,
        };
        let mut sorted = values.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len() as f64;
        let mut path = vec![(x_of(sorted[0]), 0.0)];
        for (i, v) in sorted.iter().enumerate() {
            let x = x_of(*v);
            path.push((x, i as f64 / n));
            path.push((x, (i + 1) as f64 / n));
        }
        let label = format!("{} (n={})", imp.name(), sorted.len());
        chart
            .draw_series(std::iter::once(PathElement::new(path, color.stroke_width(2))))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(
            sorted
                .iter()
                .enumerate()
                .map(|(i, v)| Circle::new((x_of(*v), (i + 1) as f64 / n), 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()?;
    Ok(())
}
