//! `#[must_use]` setters of a config's public fields, in the style of kube-runtime's
//! `watcher::Config`: `LeaseConfig::default().renew_deadline(d)`.

/// `setters!(Type { field: ArgType => value, .. })`: one setter per field, named after it.
macro_rules! setters {
    ($ty:ty { $($field:ident: $arg:ty => $value:expr),* $(,)? }) => {
        /// Setters, one per field: `Self::default().field(value)`.
        impl $ty {
            $(
                #[doc = concat!("Sets [`", stringify!($field), "`](Self::", stringify!($field), ").")]
                #[must_use]
                pub fn $field(mut self, $field: $arg) -> Self {
                    self.$field = $value;
                    self
                }
            )*
        }
    };
}

pub(crate) use setters;
