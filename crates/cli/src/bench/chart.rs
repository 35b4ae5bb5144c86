//! The bench chart (SVG): per prompt set, tok/s against slots per layer for plain decoding,
//! cached EAGLE-3 and SpecFit, and SpecFit's gain over EAGLE-3 against slots. It only draws
//! what the report holds.

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use super::report::{Report, Row};

const POLICIES: [(&str, RGBColor); 3] = [
    ("ar", RGBColor(120, 120, 120)),
    ("eagle3", RGBColor(31, 119, 180)),
    ("specfit", RGBColor(214, 39, 40)),
];

/// One prompt set's sweep: its slot points, ascending, and each main policy's tok/s at them
/// (`values[p][i]`, policy `p` of [`POLICIES`] at `slots[i]`).
struct Series<'a> {
    name: &'a str,
    slots: Vec<usize>,
    values: Vec<Vec<Option<f64>>>,
}

fn series<'a>(name: &'a str, rows: &[Row]) -> Series<'a> {
    let main = |r: &&Row| {
        r.routes == "atlas"
            && r.beta_scale == 1.0
            && !r.read_ahead
            && !r.drafter_probs
            && r.layers_ahead == 0
            && !r.again
    };
    let mut slots: Vec<usize> = rows.iter().filter(main).map(|r| r.slots).collect();
    slots.sort_unstable();
    slots.dedup();
    let values = POLICIES
        .iter()
        .map(|(p, _)| {
            slots
                .iter()
                .map(|&s| {
                    rows.iter()
                        .filter(main)
                        .find(|r| r.policy == *p && r.slots == s)
                        .map(|r| r.tok_s)
                })
                .collect()
        })
        .collect();
    Series {
        name,
        slots,
        values,
    }
}

/// The chart as SVG text.
pub fn svg(report: &Report) -> Result<String> {
    let mut text = String::new();
    let sets = report.sets.len().max(1);
    {
        let root =
            SVGBackend::with_string(&mut text, (1100, 380 * sets as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("chart: {e}"))?;
        let rows_area = root.split_evenly((sets, 2));
        for (i, set) in report.sets.iter().enumerate() {
            let series = series(&set.name, &set.rows);
            draw_rates(&rows_area[2 * i], &series)?;
            draw_gain(&rows_area[2 * i + 1], &series)?;
        }
        root.present().map_err(|e| anyhow!("chart: {e}"))?;
    }
    Ok(text)
}

fn x_label(slots: &[usize], x: f64) -> String {
    let i = x.round();
    if (x - i).abs() > 1e-6 || i < 0.0 {
        return String::new();
    }
    slots
        .get(i as usize)
        .map_or(String::new(), |s| s.to_string())
}

type Area<'b> = DrawingArea<SVGBackend<'b>, plotters::coord::Shift>;
type SlotChart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// A chart with one x position per slot count and `y` up the side, its mesh drawn.
fn slot_chart<'a, 'b>(
    area: &'a Area<'b>,
    caption: String,
    slots: &[usize],
    y: std::ops::Range<f64>,
    y_desc: &str,
) -> Result<SlotChart<'a, 'b>> {
    let n = slots.len().max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(-0.3..(n - 0.7), y)
        .map_err(|e| anyhow!("chart: {e}"))?;
    chart
        .configure_mesh()
        .x_desc("slots per layer (0 = no cache)")
        .y_desc(y_desc)
        .x_labels(slots.len().max(2))
        .x_label_formatter(&|x| x_label(slots, *x))
        .draw()
        .map_err(|e| anyhow!("chart: {e}"))?;
    Ok(chart)
}

fn draw_rates(area: &Area<'_>, series: &Series<'_>) -> Result<()> {
    let (name, slots, values) = (series.name, &series.slots, &series.values);
    let max = values
        .iter()
        .flatten()
        .flatten()
        .fold(1.0f64, |m, &v| m.max(v));
    let caption = format!("{name}: decode tok/s");
    let mut chart = slot_chart(area, caption, slots, 0.0..max * 1.15, "tok/s")?;
    for ((policy, color), ys) in POLICIES.iter().zip(values) {
        let points: Vec<(f64, f64)> = ys
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| (i as f64, v)))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| anyhow!("chart: {e}"))?
            .label(*policy)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, color.filled())),
            )
            .map_err(|e| anyhow!("chart: {e}"))?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| anyhow!("chart: {e}"))?;
    Ok(())
}

fn draw_gain(area: &Area<'_>, series: &Series<'_>) -> Result<()> {
    let (name, slots, values) = (series.name, &series.slots, &series.values);
    let gains: Vec<(f64, f64)> = values[1]
        .iter()
        .zip(&values[2])
        .enumerate()
        .filter_map(|(i, (e, s))| match (e, s) {
            (Some(e), Some(s)) if *e > 0.0 => Some((i as f64, 100.0 * (s / e - 1.0))),
            _ => None,
        })
        .collect();
    let (lo, hi) = gains.iter().fold((0.0f64, 10.0f64), |(lo, hi), &(_, g)| {
        (lo.min(g), hi.max(g))
    });
    let caption = format!("{name}: SpecFit gain over cached EAGLE-3 (%)");
    let n = slots.len().max(1) as f64;
    let y = (lo * 1.2 - 2.0)..(hi * 1.2);
    let mut chart = slot_chart(area, caption, slots, y, "gain %")?;
    let color = POLICIES[2].1;
    chart
        .draw_series(LineSeries::new(
            [(-0.3, 0.0), (n - 0.7, 0.0)],
            BLACK.mix(0.4).stroke_width(1),
        ))
        .map_err(|e| anyhow!("chart: {e}"))?;
    chart
        .draw_series(LineSeries::new(gains.clone(), color.stroke_width(2)))
        .map_err(|e| anyhow!("chart: {e}"))?;
    chart
        .draw_series(gains.into_iter().map(|p| Circle::new(p, 3, color.filled())))
        .map_err(|e| anyhow!("chart: {e}"))?;
    Ok(())
}
