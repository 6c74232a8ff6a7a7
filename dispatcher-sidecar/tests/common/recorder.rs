//! A metrics recorder for the tests that check metrics: it keeps every
//! counter, gauge and histogram by `name{label=value,...}` (labels sorted).
//! Installed with `metrics::set_global_recorder`, so each such test is its
//! own test binary.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

#[derive(Default)]
pub struct Values(pub Mutex<Vec<f64>>);

impl HistogramFn for Values {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

/// Keeps every metric by `name{label=value,...}` (labels sorted).
#[derive(Default, Clone)]
pub struct TestRecorder {
    pub counters: Arc<Mutex<HashMap<String, Arc<AtomicU64>>>>,
    pub gauges: Arc<Mutex<HashMap<String, Arc<AtomicU64>>>>,
    pub histograms: Arc<Mutex<HashMap<String, Arc<Values>>>>,
}

fn render(key: &Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let c = self
            .counters
            .lock()
            .unwrap()
            .entry(render(key))
            .or_default()
            .clone();
        Counter::from_arc(c)
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let g = self
            .gauges
            .lock()
            .unwrap()
            .entry(render(key))
            .or_default()
            .clone();
        Gauge::from_arc(g)
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let h = self
            .histograms
            .lock()
            .unwrap()
            .entry(render(key))
            .or_default()
            .clone();
        Histogram::from_arc(h)
    }
}

impl TestRecorder {
    pub fn counter(&self, name: &str) -> u64 {
        self.counters
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |c| c.load(Ordering::SeqCst))
    }

    /// Every value recorded in the histogram `name`, in order; empty when
    /// nothing was.
    pub fn histogram(&self, name: &str) -> Vec<f64> {
        self.histograms
            .lock()
            .unwrap()
            .get(name)
            .map_or_else(Vec::new, |h| h.0.lock().unwrap().clone())
    }

    pub fn gauge(&self, name: &str) -> Option<f64> {
        self.gauges
            .lock()
            .unwrap()
            .get(name)
            .map(|g| f64::from_bits(g.load(Ordering::SeqCst)))
    }
}
