//! SES subscription management onto Relay's topics. A tenant's topic may map onto an SES
//! contact list and topic (`store::topics::SesTopic`): its sends carry SES's list management
//! options (`ses::send`), and an SES `Subscription` event (a contact changed its preferences
//! through SES's unsubscribe link or header) on one of the tenant's messages becomes Relay's:
//! a topic SES reports opted out (or every topic mapped onto the list, for `unsubscribeAll`)
//! opts the message's recipients out (source `provider`, kept on the message); a topic SES
//! reports opted in again resubscribes them, with a `message.resubscribed` event. Relay's list
//! (Postgres) stays the one its sends read. The other way, the tenant's own opt-outs and
//! resubscribes through the API are written to the SES contact (`write_contact`, by the sweep's
//! `ses_contacts` service); what SES reported is never written back.

use aws_sdk_sesv2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sesv2::types::{SubscriptionStatus, TopicPreference};
use serde_json::Value;

use crate::store::messages::Message;
use crate::store::topics::SesChange;
use crate::store::{GenericClient, StoreError, message_events, topics};

/// A contact's new preferences, as SES's `Subscription` event gives them.
#[derive(Debug, PartialEq)]
pub struct Preferences {
    pub contact_list: String,
    pub unsubscribe_all: bool,
    /// Each SES topic named, and whether the contact is opted out of it.
    pub topics: Vec<(String, bool)>,
}

impl Preferences {
    /// Whether they opt the contact out of anything (every topic, or one named).
    pub fn opt_out(&self) -> bool {
        self.unsubscribe_all || self.topics.iter().any(|(_, out)| *out)
    }
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

/// Apply a `Subscription` event on `message` to the tenant's topics, for `addresses` (the
/// message's recipients the event's `mail.destination` names). Returns the events the tenant
/// hears of beyond the `Subscription` event itself (its `message.unsubscribed`, when it opts
/// out of anything): each resubscription's.
pub async fn apply(
    tx: &impl GenericClient,
    message: &Message,
    addresses: &[String],
    event: &Value,
) -> Result<Vec<(i64, &'static str)>, StoreError> {
    let Some(p) = preferences(event) else { return Ok(vec![]) };
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

/// Why a change could not be written to SES (kept on the change, which is tried again).
#[derive(Debug, thiserror::Error)]
#[error("{call} {contact_list}: {why}")]
pub struct ContactError {
    pub call: &'static str,
    pub contact_list: String,
    pub why: String,
}

/// Write a change of the tenant's to the SES contact: its preference for the change's topic
/// set, every other topic's preference, `UnsubscribeAll` and attributes kept as SES has them
/// (`UpdateContact` replaces the whole list); a contact SES does not have is created with that
/// one preference (`CreateContact`).
pub async fn write_contact(client: &aws_sdk_sesv2::Client, change: &SesChange) -> Result<(), ContactError> {
    let failed =
        |call: &'static str, why: String| ContactError { call, contact_list: change.contact_list.clone(), why };
    let status = if change.opt_out { SubscriptionStatus::OptOut } else { SubscriptionStatus::OptIn };
    let preference = |name: &str, status: SubscriptionStatus| {
        TopicPreference::builder().topic_name(name).subscription_status(status).build().map_err(|e| e.to_string())
    };
    let ours = preference(&change.ses_topic, status).map_err(|e| failed("TopicPreference", e))?;
    let found =
        client.get_contact().contact_list_name(&change.contact_list).email_address(&change.address).send().await;
    match found {
        Ok(contact) => {
            let mut kept: Vec<TopicPreference> =
                contact.topic_preferences().iter().filter(|t| t.topic_name() != change.ses_topic).cloned().collect();
            kept.push(ours);
            client
                .update_contact()
                .contact_list_name(&change.contact_list)
                .email_address(&change.address)
                .set_topic_preferences(Some(kept))
                .unsubscribe_all(contact.unsubscribe_all())
                .set_attributes_data(contact.attributes_data().map(str::to_owned))
                .send()
                .await
                .map_err(|e| failed("UpdateContact", said(&e)))?;
        }
        Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found_exception()) => {
            client
                .create_contact()
                .contact_list_name(&change.contact_list)
                .email_address(&change.address)
                .topic_preferences(ours)
                .send()
                .await
                .map_err(|e| failed("CreateContact", said(&e)))?;
        }
        Err(e) => return Err(failed("GetContact", said(&e))),
    }
    Ok(())
}

/// An SES error as the change keeps it: its code and message, or what failed on the way.
fn said<E: ProvideErrorMetadata + std::error::Error + 'static, R: std::fmt::Debug>(e: &SdkError<E, R>) -> String {
    match e.as_service_error() {
        Some(s) => format!("{}: {}", s.code().unwrap_or("error"), s.message().unwrap_or_default()),
        None => DisplayErrorContext(e).to_string(),
    }
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
        assert!(p.opt_out(), "one topic opted out");
    }

    /// The `subscription` object as AWS documents it (the SES developer guide's Subscription
    /// record, event-publishing-retrieving-sns-examples): `unsubscribeAll` beside the topics'
    /// `OptOut`/`OptIn`; an event that only opts in opts out of nothing.
    #[test]
    fn the_documented_subscription_record_reads_as_an_opt_out_and_an_opt_in_as_none() {
        let topics = |status: &str| json!([{"topicName": "ExampleTopicName", "subscriptionStatus": status}]);
        let event = json!({"eventType": "Subscription", "mail": {"messageId": "m", "destination": ["r@example.com"]},
            "subscription": {"contactList": "ContactListName", "timestamp": "2022-01-12T01:00:17.910Z",
                "source": "UnsubscribeHeader",
                "newTopicPreferences": {"unsubscribeAll": true, "topicSubscriptionStatus": topics("OptOut")},
                "oldTopicPreferences": {"unsubscribeAll": false, "topicSubscriptionStatus": topics("OptOut")}}});
        let p = preferences(&event).unwrap();
        assert_eq!((p.contact_list.as_str(), p.unsubscribe_all), ("ContactListName", true));
        assert_eq!(p.topics, [("ExampleTopicName".to_owned(), true)]);
        assert!(p.opt_out());
        let mut back = event.clone();
        back["subscription"]["newTopicPreferences"] =
            json!({"unsubscribeAll": false, "topicSubscriptionStatus": topics("OptIn")});
        assert!(!preferences(&back).unwrap().opt_out());
    }
}
