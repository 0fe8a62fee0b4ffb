user_pref("mail.biff.show_alert", false);
