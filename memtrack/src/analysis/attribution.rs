//! Regression attribution: which call sites made a metric change between two recordings.
//!
//! Pure numbers: the sites of each recording come keyed by whatever identifies a call site
//! across two builds (stack ids do not: they are per recording). The key is chosen by a layer
//! above (the runtime's symbolization keys a site by its frames' functions and files); here
//! sites of equal keys are summed, matched, and ranked by their share of the change.

use super::{Metric, Site};

/// One call site's part in a change of a metric.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SiteDelta<K> {
    /// The site's identity across the two recordings.
    pub key: K,
    /// Its value of the metric in the base (0 for a new site).
    pub base: u64,
    /// In the head (0 for a vanished site).
    pub head: u64,
    /// The site exists in the base recording (it allocated there).
    pub in_base: bool,
    /// The site exists in the head recording.
    pub in_head: bool,
}

impl<K> SiteDelta<K> {
    /// `head − base`.
    pub fn delta(&self) -> i128 {
        i128::from(self.head) - i128::from(self.base)
    }

    /// A site only in the head.
    pub fn is_new(&self) -> bool {
        self.in_head && !self.in_base
    }

    /// A site only in the base.
    pub fn vanished(&self) -> bool {
        self.in_base && !self.in_head
    }
}

/// The sites that changed a metric, ranked: [`attribute`]'s result.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Attribution<K> {
    /// The metric.
    pub metric: Metric,
    /// Its value summed over the base's sites.
    pub base_total: u64,
    /// Over the head's.
    pub head_total: u64,
    /// The sites whose value changed (new and vanished ones included), the largest
    /// contribution to the change first: by delta in the direction of the total change, then
    /// the others; ties by key. Sites with equal values on both sides are not listed.
    pub sites: Vec<SiteDelta<K>>,
    /// Sites present on both sides with equal values.
    pub unchanged: usize,
}

impl<K> Attribution<K> {
    /// `head_total − base_total` (the sum of the sites' deltas).
    pub fn delta(&self) -> i128 {
        i128::from(self.head_total) - i128::from(self.base_total)
    }

    /// A site's share of the total change (1.0 = all of it; negative for a site that moved the
    /// other way); `None` when the total did not change.
    pub fn share(&self, site: &SiteDelta<K>) -> Option<f64> {
        let total = self.delta();
        (total != 0).then(|| site.delta() as f64 / total as f64)
    }
}

impl Metric {
    /// A site's value of the metric: [`Site::blocks`], [`Site::bytes`] or
    /// [`Site::bytes_at_peak`] (its part of the recording's peak).
    pub fn site_value(self, s: &Site) -> u64 {
        match self {
            Metric::Allocations => s.blocks,
            Metric::Bytes => s.bytes,
            Metric::Peak => s.bytes_at_peak,
        }
    }
}

/// The call sites ranked by their contribution to the change of `metric` from `base` to
/// `head`, each side a list of (key, site); sites of equal keys on one side are summed.
pub fn attribute<K: Ord + Clone>(
    metric: Metric,
    base: &[(K, Site)],
    head: &[(K, Site)],
) -> Attribution<K> {
    use std::collections::BTreeMap;
    let mut merged: BTreeMap<&K, SiteDelta<K>> = BTreeMap::new();
    let (mut base_total, mut head_total) = (0u64, 0u64);
    for (side, list) in [(false, base), (true, head)] {
        for (key, site) in list {
            let v = metric.site_value(site);
            let d = merged.entry(key).or_insert_with(|| SiteDelta {
                key: key.clone(),
                base: 0,
                head: 0,
                in_base: false,
                in_head: false,
            });
            if side {
                d.head = d.head.saturating_add(v);
                d.in_head = true;
                head_total = head_total.saturating_add(v);
            } else {
                d.base = d.base.saturating_add(v);
                d.in_base = true;
                base_total = base_total.saturating_add(v);
            }
        }
    }
    let all: Vec<SiteDelta<K>> = merged.into_values().collect();
    let total = i128::from(head_total) - i128::from(base_total);
    let (mut sites, same): (Vec<_>, Vec<_>) = all
        .into_iter()
        .partition(|d| d.delta() != 0 || d.in_base != d.in_head);
    // Growth first when the total grew (shrink first when it shrank): larger |delta| first.
    let sign = if total < 0 { -1 } else { 1 };
    sites.sort_by(|a, b| {
        (b.delta() * sign)
            .cmp(&(a.delta() * sign))
            .then_with(|| a.key.cmp(&b.key))
    });
    Attribution {
        metric,
        base_total,
        head_total,
        sites,
        unchanged: same.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(blocks: u64, bytes: u64) -> Site {
        Site {
            blocks,
            bytes,
            bytes_at_peak: bytes / 2,
            ..Site::default()
        }
    }

    #[test]
    fn ranks_by_contribution_and_lists_new_and_vanished() {
        let base = [
            ("a", site(10, 1000)),
            ("b", site(5, 500)),
            ("gone", site(1, 30)),
            ("same", site(7, 70)),
        ];
        let head = [
            ("a", site(10, 1000)),
            ("b", site(3, 300)),
            ("b", site(3, 300)), // two stacks of one key are one site
            ("new", site(2, 40)),
            ("same", site(7, 70)),
        ];
        let a = attribute(Metric::Bytes, &base, &head);
        assert_eq!((a.base_total, a.head_total), (1600, 1710));
        let got: Vec<(&str, u64, u64, i128)> = a
            .sites
            .iter()
            .map(|d| (d.key, d.base, d.head, d.delta()))
            .collect();
        assert_eq!(
            got,
            [
                ("b", 500, 600, 100),
                ("new", 0, 40, 40),
                ("gone", 30, 0, -30)
            ]
        );
        assert!(a.sites[1].is_new() && a.sites[2].vanished());
        assert_eq!(a.unchanged, 2);
        assert_eq!(a.share(&a.sites[0]), Some(100.0 / 110.0));
        assert_eq!(a.sites.iter().map(|d| d.delta()).sum::<i128>(), a.delta());
        let allocs = attribute(Metric::Allocations, &base, &head);
        assert_eq!(allocs.delta(), 2);
        assert_eq!(allocs.sites[0].key, "new");
    }

    #[test]
    fn equal_sides_have_no_site_deltas() {
        let side = [("x", site(3, 30)), ("y", site(4, 40))];
        let a = attribute(Metric::Peak, &side, &side);
        assert!(a.sites.is_empty());
        assert_eq!(a.unchanged, 2);
        assert_eq!(
            a.share(&SiteDelta {
                key: "x",
                base: 1,
                head: 2,
                in_base: true,
                in_head: true
            }),
            None
        );
    }
}
