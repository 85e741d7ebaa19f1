//! SES subscription management onto Relay's topics. A tenant's topic may map onto an SES
//! contact list and topic (`store::topics::SesTopic`): its sends carry SES's list management
//! options (`ses::send`), and an SES `Subscription` event (a contact changed its preferences
//! through SES's unsubscribe link or header) on one of the tenant's messages becomes Relay's:
//! a topic SES reports opted out (or every topic mapped onto the list, for `unsubscribeAll`)
//! opts the message's recipients out (source `provider`, kept on the message); a topic SES
//! reports opted in again resubscribes them, with a `message.resubscribed` event. Relay's list
//! (Postgres) stays the one its sends read.

use std::collections::HashSet;

use serde_json::Value;

use crate::store::messages::Message;
use crate::store::{GenericClient, StoreError, message_events, topics};

/// A contact's new preferences, as SES's `Subscription` event gives them.
#[derive(Debug, PartialEq)]
pub struct Preferences {
    pub contact_list: String,
    pub unsubscribe_all: bool,
    /// Each SES topic named, and whether the contact is opted out of it.
    pub topics: Vec<(String, bool)>,
}

/// The new preferences of a `Subscription` event (`subscription.newTopicPreferences`); None
/// when the event names no contact list.
pub fn preferences(event: &Value) -> Option<Preferences> {
    let s = event.get("subscription")?;
    let contact_list = s.get("contactList")?.as_str()?.to_owned();
    let new = s.get("newTopicPreferences");
    let unsubscribe_all = new.and_then(|n| n.get("unsubscribeAll")).and_then(Value::as_bool).unwrap_or(false);
    let topics = new
        .and_then(|n| n.get("topicSubscriptionStatus"))
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(|t| {
                    let name = t.get("topicName")?.as_str()?.to_owned();
                    // `OptOut` in events, `OPT_OUT` in the API: either spelling.
                    let status = t.get("subscriptionStatus")?.as_str()?.replace('_', "").to_ascii_lowercase();
                    Some((name, status == "optout"))
                })
                .collect()
        })
        .unwrap_or_default();
    Some(Preferences { contact_list, unsubscribe_all, topics })
}

/// Apply a `Subscription` event on `message` to the tenant's topics, for the message's
/// recipients (`addressed`) the event's `mail.destination` names (all of them when it names
/// none). Returns the events the tenant hears of beyond the `Subscription` event itself (its
/// `message.unsubscribed`): each resubscription's.
pub async fn apply(
    tx: &impl GenericClient,
    message: &Message,
    addressed: &HashSet<String>,
    event: &Value,
) -> Result<Vec<(i64, &'static str)>, StoreError> {
    let Some(p) = preferences(event) else { return Ok(vec![]) };
    let named = super::events::destination(event);
    let addresses: Vec<String> = addressed.iter().filter(|a| named.is_empty() || named.contains(*a)).cloned().collect();
    let addresses = addresses.as_slice();
    if addresses.is_empty() {
        return Ok(vec![]);
    }
    let tenant = message.tenant_id;
    let mut heard = Vec::new();
    for mapped in topics::ses_topics(tx, tenant).await?.into_iter().filter(|t| t.contact_list == p.contact_list) {
        let named = p.topics.iter().find(|(name, _)| *name == mapped.ses_topic).map(|(_, out)| *out);
        match (p.unsubscribe_all, named) {
            (true, _) | (false, Some(true)) => {
                topics::opt_out(tx, tenant, addresses, &mapped.topic, "provider", Some(message.id)).await?;
            }
            (false, Some(false)) => {
                for address in addresses {
                    if topics::resubscribe(tx, tenant, address, &mapped.topic).await?.is_some()
                        && let Some(id) = message_events::record_topic_change(
                            tx,
                            tenant,
                            message.id,
                            "resubscribed",
                            address,
                            &mapped.topic,
                        )
                        .await?
                    {
                        heard.push((id, "resubscribed"));
                    }
                }
            }
            (false, None) => {}
        }
    }
    Ok(heard)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_subscription_events_new_preferences_are_read() {
        let event = json!({"eventType": "Subscription", "subscription": {"contactList": "members",
            "timestamp": "2026-11-30T10:00:00.000Z", "source": "UnsubscribeHeader",
            "newTopicPreferences": {"unsubscribeAll": false, "topicSubscriptionStatus": [
                {"topicName": "weekly", "subscriptionStatus": "OptOut"},
                {"topicName": "offers", "subscriptionStatus": "OPT_IN"}]},
            "oldTopicPreferences": {"unsubscribeAll": false, "topicSubscriptionStatus": [
                {"topicName": "weekly", "subscriptionStatus": "OptIn"}]}}});
        let p = preferences(&event).unwrap();
        assert_eq!(
            p,
            Preferences {
                contact_list: "members".into(),
                unsubscribe_all: false,
                topics: vec![("weekly".into(), true), ("offers".into(), false)]
            }
        );
        assert_eq!(preferences(&json!({"eventType": "Subscription"})), None);
    }
}
